-- Fixed window: a = window start, b = cost counted in it.
init = function(i, p) return { a = window_start(now, p.period), b = 0, c = 0 } end
advance = function(i, p, s)
  local ws = window_start(now, p.period)
  if ws > s.a then s.a = ws; s.b = 0 end
end
status = function(i, p, s, qf)
  return max(p.count - s.b, 0), max(s.a + p.period - now, 0)
end
admits = function(i, p, s, qf)
  if s.b + cost <= p.count then return nil end
  return max(s.a + p.period - now, 0)
end
commit = function(i, p, s, qf) s.b = s.b + cost end
expires = function(i, p, s)
  if s.b == 0 then return 0 end
  return s.a + p.period
end
charge = function(i, p, s, amount, qf) s.b = min(s.b + amount, MAX_SPAN) end
-- Only from the window the request was reserved in.
refund = function(i, p, s, amount, since)
  if window_start(since, p.period) == s.a then s.b = s.b - min(amount, s.b) end
end
