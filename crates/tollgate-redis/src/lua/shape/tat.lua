-- tollgate: the decision script of one-time policies, each a single GCRA,
-- token-bucket or leaky-bucket limit (after arith.lua and carry.lua). The
-- whole state of a key is one time in microseconds (the theoretical
-- arrival time, when the bucket is full again, or when the queue is next
-- free), stored as "<time>|<descriptor>" (see carry.lua) in a string that
-- expires exactly then. Smaller than the general script: no hash and no
-- reply table.
--
-- One call decides one request per key, in the order of KEYS, all at the
-- same `now`: the store sends one key per call when it is idle, and under
-- concurrent load the requests that queued meanwhile in one call (the same
-- key may stand more than once, and is decided in turn). Each request
-- carries its own three arguments, so requests of different policies mix.
--
-- KEYS[i]      the state key of request i, 1 <= i <= n
-- ARGV[3i-2]   its step: cost x interval in µs, how far an admitted
--              request moves the time; 0 when nothing can be committed (a
--              cost of 0 or one above capacity)
-- ARGV[3i-1]   its slack: (capacity - cost) x interval in µs, how far
--              ahead of now the time may be for the request to be admitted
--              A settlement (Store::settle), always read first, is
--              marked by its slack of 2^50, which no request has (its
--              step and slack add up to capacity x interval, at most
--              2^50): a step of cost x interval charges, saturating at
--              2^50 ahead of now; a negative step refunds (the time never
--              goes back past now, and a time that has passed means no
--              backlog)
-- ARGV[3i]     its policy's descriptor; a key written under another one
--              (another count or burst, or another layout) is carried over
--              and written back in this one's terms, even when denied
-- ARGV[3n+1]   (test clock only) now in µs since the Unix epoch; without it
--              the script reads Redis TIME
-- ARGV[3n+2]   (test clock only) the shortest TTL to set, in ms
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
-- For several keys, any ahead or blocked, it replies the string
-- "<seconds> <microseconds> <old_1> ... <old_n>": now as Redis TIME gave
-- it, then each request's time before it (0 where it was not ahead of
-- now, "b<until>" for a key blocked until then, which nothing changes). The client repeats the arithmetic (tollgate_core::state::decide_tat) to
-- build each decision. Every number stays below 2^53, which Lua doubles
-- hold exactly.
--
-- Written for Redis's CPU, which every decision of every app server
-- shares. Per call: TIME. Per request, reading first: a GET; then an admitted request is
-- written with one SET, and a denial writes nothing. Writing first: SET
-- ... NX GET writes an absent key and reads a present one in one command,
-- which saves an idle key the GET but costs a busy key or a denial the
-- value formatted in vain and a dearer command; the store asks for it
-- while few recent requests found their key busy. The script formats only
-- what it writes (string.format('%d') is Lua's cheapest way; a number
-- passed to redis.call is formatted by Redis with %.17g, which costs
-- more), and replies with an integer or, for several keys, one string
-- (a table reply costs more than a GET: Redis probes it for seven special
-- fields before reading it as an array).

local call = redis.call
local n = #KEYS
-- The most a time may be ahead of now, 2^50 µs, as tollgate-core's
-- MAX_SPAN_US; only a settlement's charge can reach it.
local MAX_SPAN = 1125899906842624
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

-- Writes time `at` under `descriptor`, expiring exactly then; with `nx`,
-- only if the key is absent, replying what it held (an error reply, not
-- raised, if that is a hash). (Under a test clock, whose time does not
-- pass with Redis's, the TTL is relative and at least min_ttl.)
local function put(key, at, descriptor, nx)
  local value = string.format('%d', at) .. '|' .. descriptor
  local unit, expiry = 'PXAT', nil
  if real then
    expiry = string.format('%d', math.ceil(at / 1000))
  else
    unit, expiry = 'PX', math.max(math.ceil((at - now) / 1000), min_ttl)
  end
  if nx then
    return redis.pcall('SET', key, value, unit, expiry, 'NX', 'GET')
  end
  return call('SET', key, value, unit, expiry)
end

-- The old time of each request, as the strings of the reply; created only
-- when a key's time is ahead of now (for n = 1 the reply needs none, only
-- the gap).
local olds, gap
for i = 1, n do
  local key = KEYS[i]
  local step = ARGV[3 * i - 2]
  local descriptor = ARGV[3 * i]
  local raw, fresh
  if write_first and step ~= '0' then
    -- Write now + step if the key is absent, and read it if it is not.
    raw = put(key, now + tonumber(step), descriptor, true)
    fresh = not raw
  else
    raw = redis.pcall('GET', key)
  end
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
  elseif old and old > now then
    -- The key's time is ahead: admit from it, or leave it as it is (a
    -- denial writes nothing, unless the time was carried over).
    if n == 1 then
      gap = now - old
    else
      if not olds then
        olds = {}
        for j = 1, i - 1 do olds[j] = '0' end
      end
      olds[i] = string.format('%d', old)
    end
    if step ~= '0' and old - now <= tonumber(ARGV[3 * i - 1]) then
      -- A charge saturates: with a slack of 2^50 it always gets here, and
      -- old + step may reach beyond now + 2^50, so it stops there (never
      -- below old, which is at most the slack ahead). For a request, old +
      -- step is at most now + capacity x interval, within the cap, and the
      -- test never holds: capping here costs an admitted request one
      -- comparison, where marking a charge apart (a flag argument, a
      -- prefix to parse) would cost every request more.
      local at = old + tonumber(step)
      if at - now > MAX_SPAN then at = now + MAX_SPAN end
      put(key, at, descriptor)
    elseif carried then
      put(key, old, descriptor)
    end
  else
    -- Expired, or its time has passed: as fresh. Admit and write now +
    -- step, expiring exactly then.
    if olds then olds[i] = '0' end
    if step ~= '0' and not fresh then
      put(key, now + tonumber(step), descriptor)
    elseif carried then
      call('DEL', key)
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
