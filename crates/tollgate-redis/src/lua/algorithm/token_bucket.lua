-- Token bucket: a = whole tokens, b = when the last whole token was added.
init = function(i, p) return { a = p.cap, b = now, c = 0 } end
advance = function(i, p, s)
  local gained = idiv(max(now - s.b, 0), p.interval)
  if gained >= max(p.cap - s.a, 0) then
    s.a = p.cap
    s.b = max(now, s.b)
  else
    s.a = s.a + gained
    s.b = s.b + gained * p.interval
  end
end
status = function(i, p, s, qf)
  if s.a >= p.cap then return s.a, 0 end
  return s.a, max(s.b + (p.cap - s.a) * p.interval - now, 0)
end
admits = function(i, p, s, qf)
  if cost <= s.a then return nil end
  return max(s.b + (cost - s.a) * p.interval - now, 0)
end
commit = function(i, p, s, qf) s.a = s.a - cost end
expires = function(i, p, s) return s.b + (p.cap - min(s.a, p.cap)) * p.interval end
-- Settlements work on the time the bucket is full again (below empty is a
-- later time), rebuilt into whole tokens as the carry-over does.
local function full_time(p, s) return s.b + (p.cap - min(s.a, p.cap)) * p.interval end
local function from_full(p, s, full)
  if full <= now then
    s.a, s.b = p.cap, now
    return
  end
  local tokens = max(p.cap - idiv(full - now + p.interval - 1, p.interval), 0)
  s.a, s.b = tokens, full - (p.cap - tokens) * p.interval
end
charge = function(i, p, s, amount, qf)
  from_full(p, s, charged(full_time(p, s), amount, p.interval))
end
refund = function(i, p, s, amount, since)
  local full = full_time(p, s)
  if full > now then
    from_full(p, s, max(full - span(min(amount, still_held(p, since)), p.interval), now))
  end
end
