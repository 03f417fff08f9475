-- tollgate: the decision script of window-word policies, each a single
-- fixed-window limit whose count is below its period in µs
-- (Shape::WindowWord), after arith.lua and carry.lua. The whole
-- state of a key is one integer, the window word: the window's start in
-- µs plus the cost counted in it, stored as "<word>|<descriptor>" (see
-- carry.lua) in a string that expires when the window ends. As the count
-- never reaches the period, the word's window is the word rounded down to
-- a multiple of the period, and its count is the rest. Smaller than the
-- general script: no hash and no reply table.
--
-- One call decides one request per key, in the order of KEYS, all at the
-- same `now`: the store sends one key per call when it is idle, and under
-- concurrent load the requests that queued meanwhile in one call (the same
-- key may stand more than once, and is decided in turn). Each request
-- carries its own four arguments, so requests of different policies mix.
--
-- KEYS[i]      the state key of request i, 1 <= i <= n
-- ARGV[4i-3]   its period in µs
-- ARGV[4i-2]   its step: the cost, or 0 when nothing can be committed (a
--              cost of 0, or one above the count)
-- ARGV[4i-1]   its slack: count - cost, the most the window may hold
--              already for the request to be admitted
-- ARGV[4i]     its policy's descriptor; a key written under another one
--              (another count, or another layout) is carried over and
--              written back in this one's terms, even when denied
-- ARGV[4n+1]   (test clock only) now in µs since the Unix epoch; without it
--              the script reads Redis TIME
-- ARGV[4n+2]   (test clock only) the shortest TTL to set, in ms
--
-- Replies now, as an integer, when no key held a count of its current
-- window (absent, or left over from an earlier window in the millisecond
-- it expires): each request was decided as on a new key. Otherwise it
-- replies the string "<seconds> <microseconds> <word_1> ... <word_n>": now
-- as Redis TIME gave it, then each request's word before it (0 where the
-- key held no count of the current window). The client repeats the
-- reference arithmetic (tollgate_core::state::decide_window_word) on each word.
--
-- Per call: TIME. Per request: a GET, then, if admitted, a SET: of a new
-- window's word with its expiry, or of the counted word keeping its
-- expiry; a denial writes nothing. Every number stays below 2^53, which
-- Lua doubles hold exactly; so does Lua's a % b (a - floor(a / b) * b):
-- the rounded quotient of a < 2^53 by b >= 1 never reaches the next
-- integer.

local call = redis.call
local n = #KEYS
local real = ARGV[4 * n + 1] == nil
local sec, usec, now, min_ttl
if real then
  local t = call('TIME')
  sec, usec = t[1], t[2]
  now = sec * 1000000 + usec
else
  now = tonumber(ARGV[4 * n + 1])
  min_ttl = tonumber(ARGV[4 * n + 2])
end

-- Writes `word` under `descriptor`, expiring when its window ends at
-- `ends`, or (ends = nil) keeping the key's expiry. (Under a test clock,
-- whose time does not pass with Redis's, the TTL is relative and at least
-- min_ttl.)
local function put(key, word, descriptor, ends)
  local value = string.format('%d', word) .. '|' .. descriptor
  if not ends then
    return call('SET', key, value, 'KEEPTTL')
  elseif real then
    return call('SET', key, value, 'PXAT', string.format('%d', math.ceil(ends / 1000)))
  end
  return call('SET', key, value, 'PX', math.max(math.ceil((ends - now) / 1000), min_ttl))
end

-- The words before each request, as the strings of the reply; created
-- only when a key holds a count of its current window (and for one
-- request, which is the usual call of an idle store, just that string).
local olds, only
for i = 1, n do
  local key = KEYS[i]
  local period = tonumber(ARGV[4 * i - 3])
  local step = ARGV[4 * i - 2]
  local descriptor = ARGV[4 * i]
  local start = now - now % period
  local raw = redis.pcall('GET', key)
  -- The time (word) the key held, carried over if it was written under
  -- another descriptor.
  local old, carried, blocked = nil, false, nil
  if raw then
    local bar = type(raw) == 'string' and string.find(raw, '|', 1, true)
    if bar and #raw - bar == #descriptor and string.find(raw, descriptor, bar + 1, true) then
      old = tonumber(string.sub(raw, 1, bar - 1))
    else
      if type(raw) == 'table' then
        -- A hash (the key was kept by the general script), or a failure
        -- to pass on as it is (READONLY, OOM, ...).
        if not string.find(raw.err, '^WRONGTYPE') then error(raw) end
        raw = nil
      end
      blocked = block_end(raw)
      if not blocked then
        old, carried = carried_word(key, raw, descriptor, now), true
      elseif blocked <= now then
        -- A block that has ended: as a key never seen.
        blocked = nil
      elseif n == 1 then
        only = 'b' .. string.format('%d', blocked)
      else
        if not olds then
          olds = {}
          for j = 1, i - 1 do olds[j] = '0' end
        end
        olds[i] = 'b' .. string.format('%d', blocked)
      end
    end
  end
  if blocked then
    -- Blocked: nothing changes.
  elseif old and old >= start then
    -- A count of this window (or, after Redis's clock stepped back, of a
    -- later one, which the reference keeps too): admit if it leaves room.
    local word = string.format('%d', old)
    if n == 1 then
      only = word
    else
      if not olds then
        olds = {}
        for j = 1, i - 1 do olds[j] = '0' end
      end
      olds[i] = word
    end
    local ends = nil
    if carried then ends = old - old % period + period end
    local slack = tonumber(ARGV[4 * i - 1])
    if step ~= '0' and old % period <= slack then
      put(key, old + tonumber(step), descriptor, ends)
    elseif string.byte(step) == 43 then
      -- A charge past what the word holds: the window is full.
      put(key, start + period - 1, descriptor, ends)
    elseif string.byte(step) == 45 and -1 - slack == start then
      -- A refund of a request reserved in this window.
      put(key, math.max(old + tonumber(step), start), descriptor, ends)
    elseif carried then
      put(key, old, descriptor, ends)
    end
  else
    -- A new window: admit and write its start plus the step, expiring in
    -- the millisecond the window ends.
    if olds then olds[i] = '0' end
    if step ~= '0' then
      put(key, start + tonumber(step), descriptor, start + period)
    elseif carried then
      call('DEL', key)
    end
  end
end

if not olds and not only then
  return now
end
if not real then
  sec = string.format('%d', math.floor(now / 1000000))
  usec = string.format('%d', now % 1000000)
end
return sec .. ' ' .. usec .. ' ' .. (only or table.concat(olds, ' '))
