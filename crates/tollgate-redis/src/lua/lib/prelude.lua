-- tollgate: the prelude of the general decision scripts (after arith.lua
-- and carry.lua, before the algorithm's file and epilogue.lua).
--
-- KEYS[1]      the key's state hash
-- KEYS[1 + i]  (sliding log only) the log of limit i, a sorted set named
--              after the limit's period, so that it carries over too
-- KEYS[last]   (a settlement only) the key's fence key, which a refund
--              reads (lib/fence.lua)
-- ARGV[1]      now in microseconds since the Unix epoch, or 0 to read Redis TIME
-- ARGV[2]      the cost of each request, decided in turn: "1", or "1 1 3"
--              for requests of one key that queued behind each other; or
--              a settlement (Store::settle): "+<n>" charges n more, never
--              denied, and "-<n>@<since>" refunds n of a request reserved
--              at `since` (µs)
-- ARGV[3]      the policy's descriptor (see carry.lua); state written under
--              another one is carried over
-- ARGV[4]      the shortest TTL to set, in ms: 0, except under a test clock,
--              whose time does not pass with Redis's
-- ARGV[5]      number of limits n, then per limit: count, period, interval, capacity;
--              a calendar period (fixed window) sends as its period the
--              period, then the starts of four calendar periods around the
--              sender's estimate of now, "<period> <b1> <b2> <b3> <b4>":
--              the script takes the one that holds its own now (see
--              window() below), so Redis's clock decides the window
--
-- All numbers are integers below 2^53, which Lua doubles hold exactly.
-- Products that may exceed 2^53 go through muldiv.

local function num(s) return tonumber(s) or 0 end
-- '%d', not '%.0f' or a bare number (which Redis formats with '%.17g'):
-- integer formatting is the cheapest, and every value fits a long.
local function fmt(x) return string.format('%d', x) end
local function max(a, b) if a > b then return a end return b end
local function min(a, b) if a < b then return a end return b end
-- Every amount and backlog stops at 2^50, as tollgate-core's MAX_SPAN_US.
local MAX_SPAN = 1125899906842624
-- n intervals of `interval` µs, at most MAX_SPAN.
local function span(n, interval) return min(n * interval, MAX_SPAN) end

local now = num(ARGV[1])
if now <= 0 then
  local t = redis.call('TIME')
  now = num(t[1]) * 1000000 + num(t[2])
end

-- The most units of a request reserved at `since` that can still be in
-- the backlog of rate-based limit p: they are gone by since + capacity x
-- interval, rounded up (tollgate-core's rule::still_held). A refund gives
-- back no more: the rest is later requests' backlog.
local function still_held(p, since)
  local gone = since + span(p.cap, p.interval) - now
  if gone <= 0 then return 0 end
  return idiv(gone + p.interval - 1, p.interval)
end
-- A backlog that clears at `at`, charged n intervals of `interval` µs
-- more (Store::settle): it grows from now if it had cleared, and
-- saturates at MAX_SPAN from now, never below `at` (as tollgate-core's
-- rule::charged).
local function charged(at, n, interval)
  return max(min(max(at, now) + span(n, interval), now + MAX_SPAN), at)
end
local costs = ARGV[2]
-- The cost of the request being decided, set by the epilogue.
local cost = 0
local descriptor = ARGV[3]
local min_ttl = num(ARGV[4])
local n = num(ARGV[5])
local P = {}
for i = 1, n do
  local o = 5 + (i - 1) * 4
  local period = ARGV[o + 2]
  local bounds = nil
  if string.find(period, ' ', 1, true) then
    bounds = {}
    for b in string.gmatch(period, '%d+') do bounds[#bounds + 1] = tonumber(b) end
    period = table.remove(bounds, 1)
  end
  P[i] = { count = num(ARGV[o + 1]), period = num(period), bounds = bounds,
           interval = num(ARGV[o + 3]), cap = num(ARGV[o + 4]) }
end

local key = KEYS[1]
-- Set by an algorithm whose advance rewrote stored state, or when the
-- state was carried over from another configuration.
local changed = false
-- Whether the key holds the string of a one-time or window-word
-- configuration, which the hash written below replaces.
local was_string = false
-- When an operator's block of the key ends, while it lasts (see
-- lib/block.lua); every request is then denied and nothing changes.
local blocked = nil
-- S[i]: the state of limit i, fields a, b, c (and s for the log's
-- sequence); nil for a new one.
local S = {}
-- Whether S, if carried over, was carried whole (see carry.lua).
local whole = true
do
  local flat = redis.pcall('HGETALL', key)
  if flat.err then
    -- A string (the key was kept by a word script), or a failure to pass
    -- on as it is.
    if not string.find(flat.err, '^WRONGTYPE') then error(flat) end
    was_string = true
    local value = redis.pcall('GET', key)
    if type(value) == 'table' then
      -- Neither a hash nor a string (a foreign writer's, under the
      -- prefix): no state of ours, which the write below replaces.
      if not string.find(value.err, '^WRONGTYPE') then error(value) end
      value = nil
    end
    local ends = value and block_end(value)
    if not value then
      -- Nothing of ours to carry over.
    elseif not ends then
      local carried, all = carry_over(string.match(descriptor, '^(%S+)'), P, nil, value, now)
      S, whole = carried or {}, all ~= false
    elseif ends > now then
      blocked = ends
    end
    changed = not blocked
  else
    local H = {}
    for j = 1, #flat, 2 do H[flat[j]] = flat[j + 1] end
    if H['c'] == descriptor then
      for i = 1, n do
        S[i] = { a = num(H[i .. 'a']), b = num(H[i .. 'b']), c = num(H[i .. 'c']), s = num(H[i .. 's']) }
      end
    elseif #flat > 0 then
      local carried, all = carry_over(string.match(descriptor, '^(%S+)'), P, flat, nil, now)
      S, whole = carried or {}, all ~= false
      changed = true
    end
  end
end

-- A settlement (a refund '-' or a charge '+') of a key kept under another
-- configuration that does not carry over whole changes nothing and writes
-- nothing (see carry.lua).
local adrift = false
if not whole then
  local sign = string.byte(costs)
  adrift = sign == 45 or sign == 43
end

local function window_start(t, period)
  return t - (t - idiv(t, period) * period)
end

-- The start and end of limit p's fixed window that holds t: a multiple of
-- the period, or the calendar period among the bounds sent that holds it
-- (as tollgate-core's LimitParams::window). A time outside them means a
-- clock a whole calendar period away from the sender's: an error, which
-- the store's failure policy answers.
local function window_at(t, p)
  local b = p.bounds
  if not b then
    local s = window_start(t, p.period)
    return s, s + p.period
  end
  for j = 1, #b - 1 do
    if t >= b[j] and t < b[j + 1] then return b[j], b[j + 1] end
  end
  return nil
end
local function window(t, p)
  local s, e = window_at(t, p)
  if not s then
    error('tollgate: time ' .. fmt(t) .. ' is outside the calendar periods sent')
  end
  return s, e
end

-- Defined by the algorithm below.
local init, advance, status, admits, commit, expires, charge, refund
local queue_free = function() return 0 end
