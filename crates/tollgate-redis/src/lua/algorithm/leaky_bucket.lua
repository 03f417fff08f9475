-- Leaky bucket (queue): a = when the queue next releases a request.
-- A request leaves when every limit's queue lets it: the joint departure.
init = function(i, p) return { a = 0, b = 0, c = 0 } end
advance = function(i, p, s) end
queue_free = function()
  local qf = 0
  for i = 1, n do qf = max(qf, S[i].a) end
  return qf
end
-- Each unit admitted moves the joint queue on by the longest interval: a
-- limit of a shorter one admits 1 + (room - interval) / step more.
local step = 1
for i = 1, n do step = max(step, P[i].interval) end
status = function(i, p, s, qf)
  local backlog = max(qf - now, 0)
  local room = p.cap * p.interval - backlog
  if room < p.interval then return 0, backlog end
  return 1 + idiv(room - p.interval, step), backlog
end
admits = function(i, p, s, qf)
  local departure = max(qf, now)
  if departure + cost * p.interval - now <= p.cap * p.interval then return nil end
  return departure + cost * p.interval - p.cap * p.interval - now
end
commit = function(i, p, s, qf) s.a = max(qf, now) + cost * p.interval end
expires = function(i, p, s) return s.a end
-- A charge queues like a request, from the joint departure.
charge = function(i, p, s, amount, qf) s.a = charged(qf, amount, p.interval) end
refund = function(i, p, s, amount, since)
  if s.a > now then s.a = max(s.a - span(min(amount, still_held(p, since)), p.interval), now) end
end
