-- GCRA: a = theoretical arrival time.
init = function(i, p) return { a = 0, b = 0, c = 0 } end
advance = function(i, p, s) end
status = function(i, p, s, qf)
  local backlog = max(s.a - now, 0)
  return idiv(max(p.cap * p.interval - backlog, 0), p.interval), backlog
end
admits = function(i, p, s, qf)
  local base = max(s.a, now)
  if base + cost * p.interval - now <= p.cap * p.interval then return nil end
  return base + cost * p.interval - p.cap * p.interval - now
end
commit = function(i, p, s, qf) s.a = max(s.a, now) + cost * p.interval end
expires = function(i, p, s) return s.a end
charge = function(i, p, s, amount, qf) s.a = charged(s.a, amount, p.interval) end
refund = function(i, p, s, amount, since)
  if s.a > now then s.a = max(s.a - span(min(amount, still_held(p, since)), p.interval), now) end
end
