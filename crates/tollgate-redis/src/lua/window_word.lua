-- tollgate: the decision script of window-word policies, each a single
-- fixed-window limit whose count is below its period in µs
-- (PolicyState::is_window_word). The whole state of a key is one integer,
-- the window word: the window's start in µs plus the cost counted in it,
-- stored as a decimal string that expires when the window ends. As the
-- count never reaches the period, the word's window is the word rounded
-- down to a multiple of the period, and its count is the rest. Smaller
-- than the general script: no hash, no fingerprint inside (it is part of
-- the key name) and no reply table.
--
-- One call decides one request per key, in the order of KEYS, all at the
-- same `now`: the store sends one key per call when it is idle, and under
-- concurrent load the requests that queued meanwhile in one call (the same
-- key may stand more than once, and is decided in turn). Each request
-- carries its own three arguments, so requests of different policies mix.
--
-- KEYS[i]      the state key of request i, 1 <= i <= n
-- ARGV[3i-2]   its period in µs
-- ARGV[3i-1]   its step: the cost, or 0 when nothing can be committed (a
--              cost of 0, or one above the count)
-- ARGV[3i]     its slack: count - cost, the most the window may hold
--              already for the request to be admitted
-- ARGV[3n+1]   (test clock only) now in µs since the Unix epoch; without it
--              the script reads Redis TIME
-- ARGV[3n+2]   (test clock only) the shortest TTL to set, in ms
--
-- Replies now, as an integer, when no key held a count of its current
-- window (absent, or left over from an earlier window in the millisecond
-- it expires): each request was decided as on a new key. Otherwise it
-- replies the string "<seconds> <microseconds> <word_1> ... <word_n>": now
-- as Redis TIME gave it, then each request's word before it (0 where the
-- key held no count of the current window). The client repeats the
-- reference arithmetic (PolicyState::decide_window_word) on each word.
--
-- Per call: TIME. Per request: a GET, then, if admitted, either a SET of a
-- new window's word with its expiry or an INCRBY of the step, which keeps
-- the expiry and formats nothing; a denial writes nothing. For one request
-- that is as many commands as a straightforward GCRA script (TIME, GET,
-- SET). Every number stays below 2^53, which Lua doubles hold exactly; so
-- does Lua's a % b (a - floor(a / b) * b): the rounded quotient of
-- a < 2^53 by b >= 1 never reaches the next integer.

local call = redis.call
local n = #KEYS
local real = ARGV[3 * n + 1] == nil
local sec, usec, now, min_ttl
if real then
  local t = call('TIME')
  sec, usec = t[1], t[2]
  now = sec * 1000000 + usec
else
  now = tonumber(ARGV[3 * n + 1])
  min_ttl = tonumber(ARGV[3 * n + 2])
end

-- The words before each request, as the strings of the reply; created
-- only when a key holds a count of its current window (and for one
-- request, which is the usual call of an idle store, just that string).
local olds, only
for i = 1, n do
  local key = KEYS[i]
  local period = tonumber(ARGV[3 * i - 2])
  local step = ARGV[3 * i - 1]
  local start = now - now % period
  local raw = call('GET', key)
  local old = raw and tonumber(raw)
  if old and old >= start then
    -- A count of this window (or, after Redis's clock stepped back, of a
    -- later one, which the reference keeps too): admit if it leaves room.
    if n == 1 then
      only = raw
    else
      if not olds then
        olds = {}
        for j = 1, i - 1 do olds[j] = '0' end
      end
      olds[i] = raw
    end
    if step ~= '0' and old % period <= tonumber(ARGV[3 * i]) then
      call('INCRBY', key, step)
    end
  else
    -- A new window: admit and write its start plus the step, expiring in
    -- the millisecond the window ends. (Under a test clock, whose time
    -- does not pass with Redis's, the TTL is relative and at least
    -- min_ttl.)
    if olds then olds[i] = '0' end
    if step ~= '0' then
      local word = string.format('%d', start + tonumber(step))
      local ends = start + period
      if real then
        call('SET', key, word, 'PXAT', string.format('%d', math.ceil(ends / 1000)))
      else
        call('SET', key, word, 'PX', math.max(math.ceil((ends - now) / 1000), min_ttl))
      end
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
