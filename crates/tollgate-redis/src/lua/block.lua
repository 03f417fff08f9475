-- tollgate: forgets a key's state (Store::reset), or blocks the key
-- (Store::block): deletes its state, and for a block writes
-- "<until>|blocked" (see lib/block.lua) in its place, expiring when the
-- block ends, when the key starts afresh. Either way it then fences the
-- key's refunds (see lib/fence.lua) until the fence's span after the
-- block ends (after now, for a reset), or until the fence already there
-- ends, if later.
--
-- KEYS[1]      the key's state key
-- KEYS[1 + i]  (sliding log only) the log of limit i, deleted too
-- KEYS[last]   the key's fence key
-- ARGV[1]      the block's duration in µs; 0 for a reset, which writes no
--              block
-- ARGV[2]      the fence's span in µs (Settlement::fence)
-- ARGV[3]      (test clock only) now in µs since the Unix epoch; without
--              it the script reads Redis TIME
-- ARGV[4]      (test clock only) the shortest TTL to set, in ms
--
-- Replies when the block ends (now, for a reset), in µs since the Unix
-- epoch.

local now
local test = ARGV[3]
if test then
  now = tonumber(test)
else
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
-- Sets `key` to `value` until `ends` (µs), on Redis's clock or, under a
-- test clock, for as long from now and at least the shortest TTL.
local function set_until(key, value, ends)
  if test then
    local ttl = math.max(math.ceil((ends - now) / 1000), tonumber(ARGV[4]))
    redis.call('SET', key, value, 'PX', string.format('%d', ttl))
  elseif ends > now then
    redis.call('SET', key, value, 'PXAT', string.format('%d', math.ceil(ends / 1000)))
  end
end
if not fence_key then error('tollgate: no fence key') end
local ends = now + tonumber(ARGV[1])
redis.call('DEL', unpack(KEYS, 1, state_keys))
if ends > now then
  set_until(KEYS[1], string.format('%d', ends) .. '|blocked', ends)
end
local fenced_until = ends + tonumber(ARGV[2])
local earlier = redis.call('GET', fence_key)
if type(earlier) == 'string' then
  local until_then = tonumber(string.match(earlier, ' (%d+)$'))
  if until_then and until_then > fenced_until then fenced_until = until_then end
end
set_until(fence_key, string.format('%d %d', now, fenced_until), fenced_until)
return string.format('%d', ends)
