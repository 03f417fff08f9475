-- tollgate: the decision script of a single fixed-window limit whose count
-- is below its period in µs (PolicyState::is_window_word). The whole state
-- of a key is one integer, the window word: the window's start in µs plus
-- the cost counted in it, stored as a decimal string that expires when the
-- window ends. As the count never reaches the period, the word's window is
-- the word rounded down to a multiple of the period, and its count is the
-- rest. Smaller than the general script: no hash, no fingerprint inside
-- (it is part of the key name) and no reply table.
--
-- KEYS[1]  the state key
-- ARGV[1]  the period in µs
-- ARGV[2]  the step: the cost, or 0 when nothing can be committed (a cost
--          of 0, or one above the count)
-- ARGV[3]  the slack: count - cost, the most the window may hold already
--          for the request to be admitted
-- ARGV[4]  (test clock only) now in µs since the Unix epoch; without it
--          the script reads Redis TIME
-- ARGV[5]  (test clock only) the shortest TTL to set, in ms
--
-- Replies now, as an integer, when the key held no count of the current
-- window (absent, or left over from an earlier window in the millisecond
-- it expires): the request is decided as on a new key. Otherwise it
-- replies the string "<seconds> <microseconds> <word>", now as Redis TIME
-- gave it and the word before the request, and the client repeats the
-- reference arithmetic (PolicyState::decide_window_word) on that word.
--
-- Per call: TIME and a GET, then, for an admitted request, either a SET of
-- a new window's word with its expiry or an INCRBY of the step, which
-- keeps the expiry and formats nothing; a denial writes nothing. The same
-- number of commands as a straightforward GCRA script (TIME, GET, SET).
-- Every number stays below 2^53, which Lua doubles hold exactly; so does
-- Lua's a % b (a - floor(a / b) * b): the rounded quotient of a < 2^53 by
-- b >= 1 never reaches the next integer.

local call = redis.call
local real = ARGV[4] == nil
local sec, usec, now
if real then
  local t = call('TIME')
  sec, usec = t[1], t[2]
  now = sec * 1000000 + usec
else
  now = tonumber(ARGV[4])
end
local key, period, step = KEYS[1], tonumber(ARGV[1]), ARGV[2]
local start = now - now % period

local raw = call('GET', key)
local old = raw and tonumber(raw)
if old and old >= start then
  -- A count of this window (or, after Redis's clock stepped back, of a
  -- later one, which the reference keeps too): admit if it leaves room.
  if step ~= '0' and old % period <= tonumber(ARGV[3]) then
    call('INCRBY', key, step)
  end
  if not real then
    sec = string.format('%d', math.floor(now / 1000000))
    usec = string.format('%d', now % 1000000)
  end
  return sec .. ' ' .. usec .. ' ' .. raw
end

-- A new window: admit and write its start plus the step, expiring in the
-- millisecond the window ends. (Under a test clock, whose time does not
-- pass with Redis's, the TTL is relative and at least the shortest TTL.)
if step ~= '0' then
  local word = string.format('%d', start + tonumber(step))
  local ends = start + period
  if real then
    call('SET', key, word, 'PXAT', string.format('%d', math.ceil(ends / 1000)))
  else
    call('SET', key, word, 'PX',
      math.max(math.ceil((ends - now) / 1000), tonumber(ARGV[5])))
  end
end
return now
