-- tollgate: the decision script of a one-word policy, a single GCRA,
-- token-bucket or leaky-bucket limit. The whole state is one time in
-- microseconds (the theoretical arrival time, when the bucket is full
-- again, or when the queue is next free), stored as a
-- string that expires exactly then. Smaller than the general script: no
-- hash, no fingerprint inside (it is part of the key name), and in the
-- common case two commands, TIME and one SET. Needs Redis 7.0 or later
-- (SET with both NX and GET).
--
-- KEYS[1]  the state key
-- ARGV[1]  step: cost x interval in µs, how far an admitted request moves
--          the time; 0 when nothing can be committed (a cost of 0 or one
--          above capacity)
-- ARGV[2]  tolerance: capacity x interval in µs, how far ahead of now the
--          time may be
-- ARGV[3]  (test clock only) now in µs since the Unix epoch; without it
--          the script reads Redis TIME
-- ARGV[4]  (test clock only) the shortest TTL to set, in ms
--
-- Replies now, when the time before the request was at most now (the
-- request is admitted), or else { now, the time before the request }. The
-- client repeats the arithmetic (PolicyState::decide_word) to build the
-- decision. Every number stays below 2^53, which Lua doubles hold exactly.

-- The common path is written for speed: two arguments, no closure, no
-- number that Redis must format with %.17g (string.format('%d') is several
-- times cheaper).

local key = KEYS[1]
local real = ARGV[3] == nil
local now
if real then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(ARGV[3])
end
local step = tonumber(ARGV[1])
if step == 0 then
  return { now, tonumber(redis.call('GET', key)) or 0 }
end

-- Most keys are idle when a request comes: the key expired when its time
-- passed, the request is admitted and the new time is now + step. Write
-- that only if the key is absent (NX), expiring exactly then, and read the
-- old value in the same command. (Under a test clock, whose time does not
-- pass with Redis's, the TTL is relative and at least ARGV[4].)
local at = now + step
local old
if real then
  old = redis.call('SET', key, string.format('%d', at),
    'PXAT', string.format('%d', math.ceil(at / 1000)), 'NX', 'GET')
else
  old = redis.call('SET', key, string.format('%d', at), 'PX',
    math.max(math.ceil((at - now) / 1000), tonumber(ARGV[4])), 'NX', 'GET')
end
if not old then
  return now
end

-- The key holds a time: admit from the later of it and now, or leave it
-- as it is (a denial writes nothing).
old = tonumber(old) or 0
at = math.max(old, now) + step
if at - now <= tonumber(ARGV[2]) then
  if real then
    redis.call('SET', key, string.format('%d', at),
      'PXAT', string.format('%d', math.ceil(at / 1000)))
  else
    redis.call('SET', key, string.format('%d', at), 'PX',
      math.max(math.ceil((at - now) / 1000), tonumber(ARGV[4])))
  end
end
return { now, old }
