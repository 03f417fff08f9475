-- tollgate: the decision script of one-word policies, each a single GCRA,
-- token-bucket or leaky-bucket limit. The whole state of a key is one time
-- in microseconds (the theoretical arrival time, when the bucket is full
-- again, or when the queue is next free), stored as a string that expires
-- exactly then. Smaller than the general script: no hash, no fingerprint
-- inside (it is part of the key name), and in the common case two
-- commands, TIME and one SET. Needs Redis 7.0 or later (SET with both NX
-- and GET).
--
-- One call decides one request per key, in the order of KEYS, all at the
-- same `now`: the store sends one key per call when it is idle, and under
-- concurrent load the requests that queued meanwhile in one call (the same
-- key may stand more than once, and is decided in turn). Each request
-- carries its own two arguments, so requests of different policies mix.
--
-- KEYS[i]      the state key of request i, 1 <= i <= n
-- ARGV[2i-1]   its step: cost x interval in µs, how far an admitted
--              request moves the time; 0 when nothing can be committed (a
--              cost of 0 or one above capacity)
-- ARGV[2i]     its tolerance: capacity x interval in µs, how far ahead of
--              now the time may be
-- ARGV[2n+1]   (test clock only) now in µs since the Unix epoch; without it
--              the script reads Redis TIME
-- ARGV[2n+2]   (test clock only) the shortest TTL to set, in ms
--
-- Replies now, when every key's time before its request was at most now
-- (the usual case: an idle key has expired), or else { now, old_1, ...,
-- old_n }, each request's time before it (0 for an expired key). The
-- client repeats the arithmetic (PolicyState::decide_word) to build each
-- decision. Every number stays below 2^53, which Lua doubles hold exactly.

-- The common path is written for speed: no closure, no number that Redis
-- must format with %.17g (string.format('%d') is several times cheaper),
-- and no reply table unless a key held a time.

local n = #KEYS
local real = ARGV[2 * n + 1] == nil
local now, min_ttl
if real then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(ARGV[2 * n + 1])
  min_ttl = tonumber(ARGV[2 * n + 2])
end

local out
for i = 1, n do
  local key = KEYS[i]
  local step = tonumber(ARGV[2 * i - 1])
  local old
  if step == 0 then
    old = tonumber(redis.call('GET', key))
  else
    -- Most keys are idle when a request comes: the key expired when its
    -- time passed, the request is admitted and the new time is now + step.
    -- Write that only if the key is absent (NX), expiring exactly then, and
    -- read the old value in the same command. (Under a test clock, whose
    -- time does not pass with Redis's, the TTL is relative and at least
    -- min_ttl.)
    local at = now + step
    if real then
      old = redis.call('SET', key, string.format('%d', at),
        'PXAT', string.format('%d', math.ceil(at / 1000)), 'NX', 'GET')
    else
      old = redis.call('SET', key, string.format('%d', at), 'PX',
        math.max(math.ceil((at - now) / 1000), min_ttl), 'NX', 'GET')
    end
    if old then
      -- The key holds a time: admit from the later of it and now, or leave
      -- it as it is (a denial writes nothing).
      old = tonumber(old) or 0
      at = math.max(old, now) + step
      if at - now <= tonumber(ARGV[2 * i]) then
        if real then
          redis.call('SET', key, string.format('%d', at),
            'PXAT', string.format('%d', math.ceil(at / 1000)))
        else
          redis.call('SET', key, string.format('%d', at), 'PX',
            math.max(math.ceil((at - now) / 1000), min_ttl))
        end
      end
    end
  end
  if old then
    if out then
      out[i + 1] = old
    elseif i == 1 then
      -- Built whole: a table grown by one slot at a time costs a resize.
      out = { now, old }
    else
      out = { now }
      for j = 1, i - 1 do
        out[j + 1] = 0
      end
      out[i + 1] = old
    end
  elseif out then
    out[i + 1] = 0
  end
end
return out or now
