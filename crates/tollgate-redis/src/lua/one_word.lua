-- tollgate: the decision script of one-word policies, each a single GCRA,
-- token-bucket or leaky-bucket limit. The whole state of a key is one time
-- in microseconds (the theoretical arrival time, when the bucket is full
-- again, or when the queue is next free), stored as a decimal string that
-- expires exactly then. Smaller than the general script: no hash, no
-- fingerprint inside (it is part of the key name) and no reply table.
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
-- ARGV[2i]     its slack: (capacity - cost) x interval in µs, how far
--              ahead of now the time may be for the request to be admitted
-- ARGV[2n+1]   (test clock only) now in µs since the Unix epoch; without it
--              the script reads Redis TIME
-- ARGV[2n+2]   (test clock only) the shortest TTL to set, in ms
--
-- The store sends this file after a first line that sets write_first,
-- `local write_first = true` or `false` (see below): two scripts with two
-- SHA-1s, rather than one more argument, which would cost Redis more.
--
-- Replies now, as a positive integer, when no key's time was ahead of now
-- (the usual case: an idle key has expired, or its time has passed). For
-- one key whose time was ahead, it replies now minus that time, a negative
-- integer: the decision depends only on how far ahead the time was, and
-- the client stamps it with Redis's clock as its recent replies showed it.
-- For several keys, any ahead, it replies the string
-- "<seconds> <microseconds> <old_1> ... <old_n>": now as Redis TIME gave
-- it, then each request's time before it (0 where it was not ahead of
-- now). The client repeats the arithmetic (PolicyState::decide_word) to
-- build each decision. Every number stays below 2^53, which Lua doubles
-- hold exactly.
--
-- Written for Redis's CPU, which every decision of every app server
-- shares (BENCHMARKS.md, "Redis CPU per decision", prices each step).
-- Per call: TIME. Per request, reading first: a GET; then an idle key
-- (absent, or its time has passed) is written with one SET, a busy one
-- with INCRBY and PEXPIREAT, and a denial writes nothing. Writing first:
-- SET ... NX GET writes an absent key and reads a present one in one
-- command, which saves an idle key the GET but costs a busy key or a
-- denial the two numbers formatted in vain and a dearer command; the
-- store asks for it while few recent requests found their key busy. Each Lua
-- number turned into a string costs about half a GET (string.format('%d')
-- is Lua's cheapest way; a number passed to redis.call is formatted by
-- Redis with %.17g, which costs more), and a table reply costs more than
-- a GET (Redis probes it for seven special fields before reading it as an
-- array). So the script formats only what it writes, and replies with an
-- integer or, for several keys, one string concatenated from strings it
-- already holds (about 3,000 instructions, which one key saves).

local call = redis.call
local n = #KEYS
local real = ARGV[2 * n + 1] == nil
local sec, usec, now, min_ttl
if real then
  local t = call('TIME')
  sec, usec = t[1], t[2]
  now = sec * 1000000 + usec
else
  now = tonumber(ARGV[2 * n + 1])
  min_ttl = tonumber(ARGV[2 * n + 2])
end

-- The old time of each request, as the strings of the reply; created only
-- when a key's time is ahead of now (for n = 1 the reply needs none, only
-- the gap).
local olds, gap
for i = 1, n do
  local key = KEYS[i]
  local step = ARGV[2 * i - 1]
  local raw, fresh
  if write_first and step ~= '0' then
    -- Write now + step, expiring exactly then, if the key is absent, and
    -- read it if it is not. (Under a test clock, whose time does not pass
    -- with Redis's, the TTL is relative and at least min_ttl.)
    local at = now + tonumber(step)
    if real then
      raw = call('SET', key, string.format('%d', at),
        'PXAT', string.format('%d', math.ceil(at / 1000)), 'NX', 'GET')
    else
      raw = call('SET', key, string.format('%d', at), 'PX',
        math.max(math.ceil((at - now) / 1000), min_ttl), 'NX', 'GET')
    end
    fresh = not raw
  else
    raw = call('GET', key)
  end
  local old = raw and tonumber(raw)
  if old and old > now then
    -- The key's time is ahead: admit from it, or leave it as it is (a
    -- denial writes nothing).
    if n == 1 then
      gap = now - old
    else
      if not olds then
        olds = {}
        for j = 1, i - 1 do olds[j] = '0' end
      end
      olds[i] = raw
    end
    if step ~= '0' and old - now <= tonumber(ARGV[2 * i]) then
      if real then
        -- INCRBY adds the step to the stored integer in place, keeps the
        -- TTL and replies the new time as a number, which PEXPIREAT then
        -- sets as the expiry: cheaper than a SET, whose value would need
        -- formatting too.
        local at = call('INCRBY', key, step)
        call('PEXPIREAT', key, string.format('%d', math.ceil(at / 1000)))
      else
        -- Under a test clock, whose time does not pass with Redis's, the
        -- TTL is relative and at least min_ttl.
        local at = old + tonumber(step)
        call('SET', key, string.format('%d', at), 'PX',
          math.max(math.ceil((at - now) / 1000), min_ttl))
      end
    end
  else
    -- Expired, or its time has passed: as fresh. Admit and write now +
    -- step, expiring exactly then.
    if olds then olds[i] = '0' end
    if step ~= '0' and not fresh then
      local at = now + tonumber(step)
      if real then
        call('SET', key, string.format('%d', at),
          'PXAT', string.format('%d', math.ceil(at / 1000)))
      else
        call('SET', key, string.format('%d', at), 'PX',
          math.max(math.ceil((at - now) / 1000), min_ttl))
      end
    end
  end
end

if gap then
  return gap
end
if not olds then
  return now
end
if not real then
  sec = string.format('%d', math.floor(now / 1000000))
  usec = string.format('%d', now % 1000000)
end
return sec .. ' ' .. usec .. ' ' .. table.concat(olds, ' ')
