-- tollgate: shared prelude of every decision script.
--
-- KEYS[1]      the key's state hash
-- KEYS[1 + i]  (sliding log only) the log of limit i, a sorted set
-- ARGV[1]      now in microseconds since the Unix epoch, or 0 to read Redis TIME
-- ARGV[2]      cost
-- ARGV[3]      policy fingerprint; state stored under another one is ignored
-- ARGV[4]      the shortest TTL to set, in ms: 0, except under a test clock,
--              whose time does not pass with Redis's
-- ARGV[5]      number of limits n, then per limit: count, period, interval, capacity
--
-- All numbers are integers below 2^53, which Lua doubles hold exactly.
-- Products that may exceed 2^53 go through muldiv.

local TWO24 = 16777216

-- floor(a / b) for integers 0 <= a, 0 < b, a + b < 2^53.
local function idiv(a, b)
  local q = math.floor(a / b)
  while q * b > a do q = q - 1 end
  while (q + 1) * b <= a do q = q + 1 end
  return q
end

-- min(floor(a * b / c), cap) and whether a * b is a multiple of c, exactly,
-- for integers 0 <= a, b < 2^48 and 0 < c < 2^52.
local function muldiv(a, b, c, cap)
  if a == 0 or b == 0 then return 0, true end
  local p = a * b
  if p < 4503599627370496 then
    -- Below 2^52 the double product is exact; at or above 2^53 it cannot
    -- round below 2^52, so larger products always take the slow path.
    local q = idiv(p, c)
    if q > cap then return cap, false end
    return q, q * c == p
  end
  -- a * b in four base-2^24 limbs, then binary long division by c.
  local ah, al = math.floor(a / TWO24), a % TWO24
  local bh, bl = math.floor(b / TWO24), b % TWO24
  local p0 = al * bl
  local t = al * bh + ah * bl + math.floor(p0 / TWO24)
  local l0 = p0 % TWO24
  local l1 = t % TWO24
  t = ah * bh + math.floor(t / TWO24)
  local l2 = t % TWO24
  local l3 = math.floor(t / TWO24)
  local q, r = 0, 0
  for _, limb in ipairs({ l3, l2, l1, l0 }) do
    local bit = 8388608
    for _ = 1, 24 do
      r = r * 2
      if limb >= bit then
        limb = limb - bit
        r = r + 1
      end
      bit = bit / 2
      q = q * 2
      if r >= c then
        r = r - c
        q = q + 1
      end
      if q > cap then return cap, false end
    end
  end
  return q, r == 0
end

local function num(s) return tonumber(s) or 0 end
-- '%d', not '%.0f' or a bare number (which Redis formats with '%.17g'):
-- integer formatting is the cheapest, and every value fits a long.
local function fmt(x) return string.format('%d', x) end
local function max(a, b) if a > b then return a end return b end
local function min(a, b) if a < b then return a end return b end

local now = num(ARGV[1])
if now <= 0 then
  local t = redis.call('TIME')
  now = num(t[1]) * 1000000 + num(t[2])
end
local cost = num(ARGV[2])
local fp = ARGV[3]
local min_ttl = num(ARGV[4])
local n = num(ARGV[5])
local P = {}
for i = 1, n do
  local o = 5 + (i - 1) * 4
  P[i] = { count = num(ARGV[o + 1]), period = num(ARGV[o + 2]),
           interval = num(ARGV[o + 3]), cap = num(ARGV[o + 4]) }
end

local key = KEYS[1]
local H = {}
do
  local flat = redis.call('HGETALL', key)
  for j = 1, #flat, 2 do H[flat[j]] = flat[j + 1] end
end
local fresh = H['fp'] ~= fp
-- S[i]: the state of limit i, fields a, b, c (and s for the log's sequence).
local S = {}
for i = 1, n do
  if fresh then
    S[i] = nil
  else
    S[i] = { a = num(H[i .. 'a']), b = num(H[i .. 'b']), c = num(H[i .. 'c']), s = num(H[i .. 's']) }
  end
end

local function window_start(t, period)
  return t - (t - idiv(t, period) * period)
end

-- Set by an algorithm whose advance rewrote stored state.
local changed = false

-- Defined by the algorithm below.
local init, advance, status, admits, commit, expires
local queue_free = function() return 0 end
