-- tollgate: carrying a key's state over from another configuration of its
-- policy (PolicyState::carry_to in tollgate-core), shared by every decision
-- script.
--
-- A key has one Redis key per policy name, whatever the configuration. Its
-- state records the configuration it was written under as a descriptor,
-- "<algorithm> <period>/<interval>/<capacity> ...", one triple per limit:
-- the general scripts in the hash field 'c', the one-time and window-word
-- scripts after the word, "<word>|<descriptor>". A script that finds
-- another descriptor (or the other kind of value: a hash where it keeps a
-- string, or the reverse) carries the state over:
--
-- - limits are matched by period (a policy has one limit per period): a
--   limit takes the state of the old limit of its period, a limit without
--   one starts afresh, an old limit without a match is dropped;
-- - windows and logs keep their counts; a GCRA's arrival time, a queue's
--   departure and the time a token bucket is full again are backlogs of
--   intervals, rescaled to the new interval (rounded up, at most 2^50 µs);
-- - another algorithm starts every limit afresh.
--
-- A settlement (a refund or a charge) is not carried where the carry is
-- not whole (another algorithm, or an old limit without a match) and the
-- old state still holds use: it changes nothing of the key and writes
-- nothing, since the request was reserved under a plan, an override or a
-- deploy that the key has moved on from, and carrying the key over would
-- drop what its own limits hold. It replies with the state carried over,
-- as a fenced refund does. A state that holds no use drops nothing, and
-- is as no state at all (which Redis would have let expire).
--
-- carry_over(alg, P, flat, value, now) returns nil when the key holds no
-- state of this policy at all, else the carried state of each limit of P
-- in the general scripts' fields { a, b, c, s } (nil where none carries)
-- and whether the carry is whole (tollgate-core's
-- PolicyState::carries_whole), or drops nothing since the old state holds
-- no use any more (PolicyState::holds_use).
-- `flat` is the key's hash as HGETALL returned it, or nil and `value` its
-- string. Defined inside one function, so that a script pays for it only
-- when a key changed configuration.

local function carry_over(alg, P, flat, value, now)
  local MAX_SPAN = 1125899906842624 -- 2^50, as tollgate-core's MAX_SPAN_US

  local function window_start(t, period)
    return t - (t - idiv(t, period) * period)
  end

  -- A fixed window begun at `a` under another calendar (a zone or offset
  -- changed, or a calendar added or removed), as a window of p (as
  -- FixedWindow::carried): the one starting nearest `a` if it has begun,
  -- else the one holding `a`. A start outside the bounds sent is left as it
  -- is (an ended window).
  local function realigned(a, p)
    local ws, we
    local b = p.bounds
    if b then
      for j = 1, #b - 1 do
        if a >= b[j] and a < b[j + 1] then ws, we = b[j], b[j + 1] end
      end
      if not ws then return a end
    else
      ws = window_start(a, p.period)
      we = ws + p.period
    end
    local near = ws
    if a - ws > we - a then near = we end
    if near > now then near = ws end
    return near
  end

  -- A token bucket that is full again at `full`: whole tokens, and the
  -- last refill on the grid of intervals that ends there.
  local function full_at(full, cap, interval)
    if full <= now then return cap, now end
    local missing = idiv(full - now + interval - 1, interval)
    local tokens = cap - missing
    if tokens < 0 then tokens = 0 end
    return tokens, full - (cap - tokens) * interval
  end

  -- A time when a backlog of intervals of `from` µs clears, as the time
  -- the same number of intervals of `to` µs clears.
  local function rescale(word, from, to)
    if word <= now or from == to then return word end
    local q, exact = muldiv(word - now, to, from, MAX_SPAN)
    if not exact then q = q + 1 end
    if q > MAX_SPAN then q = MAX_SPAN end
    return now + q
  end

  local function limits_of(descriptor)
    local limits = {}
    for period, interval, cap in string.gmatch(descriptor, '(%d+)/(%d+)/(%d+)') do
      limits[#limits + 1] = { period = tonumber(period), interval = tonumber(interval),
                              cap = tonumber(cap), a = 0, b = 0, c = 0, s = 0 }
    end
    return string.match(descriptor, '^(%S+)'), limits
  end

  local old_alg, O, old_descriptor
  if flat then
    local H = {}
    for j = 1, #flat, 2 do H[flat[j]] = flat[j + 1] end
    if not H['c'] then return nil end
    old_descriptor = H['c']
    old_alg, O = limits_of(old_descriptor)
    for j, o in ipairs(O) do
      o.a = tonumber(H[j .. 'a']) or 0
      o.b = tonumber(H[j .. 'b']) or 0
      o.c = tonumber(H[j .. 'c']) or 0
      o.s = tonumber(H[j .. 's']) or 0
    end
  else
    local bar = string.find(value, '|', 1, true)
    if not bar then return nil end
    local word = tonumber(string.sub(value, 1, bar - 1))
    old_descriptor = string.sub(value, bar + 1)
    old_alg, O = limits_of(old_descriptor)
    local o = O[1]
    if not word or not o then return nil end
    if old_alg == 'token_bucket' then
      o.a, o.b = full_at(word, o.cap, o.interval)
    elseif old_alg == 'fixed_window' then
      o.a = window_start(word, o.period)
      o.b = word - o.a
    else
      o.a = word
    end
  end

  -- Whether the old state still holds use that carrying it over could
  -- drop (tollgate-core's PolicyState::holds_use): a limit whose expiry
  -- (each algorithm's `expires`) is ahead; under a calendar, whose
  -- periods' ends the descriptor does not tell, a limit not empty.
  local after = now
  if string.find(old_descriptor, ' cal:', 1, true) then after = 0 end
  local live = false
  for _, o in ipairs(O) do
    local ends
    if old_alg == 'gcra' or old_alg == 'leaky_bucket' then
      ends = o.a
    elseif old_alg == 'token_bucket' then
      local held = o.a
      if held > o.cap then held = o.cap end
      ends = o.b + (o.cap - held) * o.interval
    elseif old_alg == 'fixed_window' then
      ends = 0
      if o.b > 0 then ends = window_start(o.a, o.period) + o.period end
    elseif old_alg == 'sliding_window' then
      ends = 0
      if o.c > 0 then ends = o.a + 2 * o.period
      elseif o.b > 0 then ends = o.a + o.period end
    else
      -- The sliding log: a = what it holds, b = its last entry's time.
      ends = 0
      if o.a > 0 then ends = o.b + o.period end
    end
    if ends > after then live = true end
  end

  local S = {}
  if old_alg ~= alg then return S, not live end
  local matched = 0
  for i, p in ipairs(P) do
    for _, o in ipairs(O) do
      if o.period == p.period then
        matched = matched + 1
        if alg == 'gcra' or alg == 'leaky_bucket' then
          S[i] = { a = rescale(o.a, o.interval, p.interval), b = 0, c = 0, s = 0 }
        elseif alg == 'token_bucket' then
          local held = o.a
          if held > o.cap then held = o.cap end
          local full = rescale(o.b + (o.cap - held) * o.interval, o.interval, p.interval)
          local tokens, refilled = full_at(full, p.cap, p.interval)
          S[i] = { a = tokens, b = refilled, c = 0, s = 0 }
        elseif alg == 'fixed_window' then
          S[i] = { a = realigned(o.a, p), b = o.b, c = o.c, s = o.s }
        else
          S[i] = { a = o.a, b = o.b, c = o.c, s = o.s }
        end
      end
    end
  end
  -- Periods are unique in a policy: every old limit matched one of P.
  return S, matched == #O or not live
end

-- The compact form of S, carried state of a single limit p of `alg` (see
-- PolicyState::word): the time its backlog clears, or a fixed window's
-- start plus its count (at most the period less 1 µs).
local function word_of(alg, p, s)
  if alg == 'token_bucket' then
    local held = s.a
    if held > p.cap then held = p.cap end
    return s.b + (p.cap - held) * p.interval
  elseif alg == 'fixed_window' then
    local count = s.b
    if count > p.period - 1 then count = p.period - 1 end
    return s.a + count
  end
  return s.a
end
