-- Sliding window counter: a = current window start, b = previous count, c = current count.
init = function(i, p) return { a = window_start(now, p.period), b = 0, c = 0 } end
advance = function(i, p, s)
  local ws = window_start(now, p.period)
  if ws > s.a then
    if ws - s.a == p.period then s.b = s.c else s.b = 0 end
    s.c = 0
    s.a = ws
  end
end
-- ceil(prev * (P - e) / P)
local function weighted(prev, elapsed, period)
  local left = max(period - elapsed, 0)
  local q, exact = muldiv(prev, left, period, prev)
  if exact then return q end
  return q + 1
end
-- The smallest e in 0..P with count * (P - e) <= budget_a * budget_b.
local function first_offset(count, budget_a, budget_b, period)
  if count == 0 then return 0 end
  local k = muldiv(budget_a, budget_b, count, period)
  return period - k
end
status = function(i, p, s, qf)
  local used = s.c + weighted(s.b, max(now - s.a, 0), p.period)
  local reset
  if s.c > 0 then reset = s.a + 2 * p.period
  elseif s.b > 0 then reset = s.a + p.period
  else reset = now end
  return max(p.count - used, 0), max(reset - now, 0)
end
admits = function(i, p, s, qf)
  local elapsed = max(now - s.a, 0)
  if s.c + weighted(s.b, elapsed, p.period) + cost <= p.count then return nil end
  local budget = p.count - (s.c + cost)
  if budget >= 0 then
    local e = first_offset(s.b, budget, p.period, p.period)
    if e < p.period then return max(s.a + e - now, 0) end
  end
  local e = first_offset(s.c, p.count - cost, p.period, p.period)
  return max(s.a + p.period + e - now, 0)
end
commit = function(i, p, s, qf) s.c = s.c + cost end
expires = function(i, p, s)
  if s.c > 0 then return s.a + 2 * p.period end
  if s.b > 0 then return s.a + p.period end
  return 0
end
charge = function(i, p, s, amount, qf) s.c = min(s.c + amount, MAX_SPAN) end
-- From the window the request was reserved in, current or previous.
refund = function(i, p, s, amount, since)
  local reserved_in = window_start(since, p.period)
  if reserved_in == s.a then s.c = s.c - min(amount, s.c)
  elseif reserved_in + p.period == s.a then s.b = s.b - min(amount, s.b) end
end
