-- tollgate: exact integer arithmetic on Lua doubles, shared by every
-- decision script. All numbers are integers below 2^53, which doubles hold
-- exactly; products that may exceed 2^53 go through muldiv.

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
