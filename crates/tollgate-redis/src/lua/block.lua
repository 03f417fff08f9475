-- tollgate: blocks a key (Store::block): forgets its state and denies it
-- until the block ends, when it starts afresh. Writes "<until>|blocked"
-- (see lib/block.lua) in place of the state, expiring when the block ends.
--
-- KEYS[1]      the key's state key
-- KEYS[1 + i]  (sliding log only) the log of limit i, deleted too
-- ARGV[1]      the block's duration in µs
-- ARGV[2]      (test clock only) now in µs since the Unix epoch; without
--              it the script reads Redis TIME
-- ARGV[3]      (test clock only) the shortest TTL to set, in ms
--
-- Replies when the block ends, in µs since the Unix epoch.

local now
if ARGV[2] then
  now = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local ends = now + tonumber(ARGV[1])
redis.call('DEL', unpack(KEYS))
local value = string.format('%d', ends) .. '|blocked'
if ARGV[2] then
  local ttl = math.max(math.ceil((ends - now) / 1000), tonumber(ARGV[3]))
  redis.call('SET', KEYS[1], value, 'PX', string.format('%d', ttl))
elseif ends > now then
  redis.call('SET', KEYS[1], value, 'PXAT', string.format('%d', math.ceil(ends / 1000)))
end
return string.format('%d', ends)
