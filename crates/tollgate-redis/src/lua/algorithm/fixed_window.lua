-- Fixed window: a = window start, b = cost counted in it. Windows are
-- multiples of the period, or calendar periods (see window() in the
-- prelude); a window ends where the window holding its start ends.
local function window_end(p, s)
  local _, e = window(s.a, p)
  return e
end
init = function(i, p) return { a = (window(now, p)), b = 0, c = 0 } end
-- A window begun under another calendar (a zone or offset changed, or a
-- calendar added or removed) is first taken for the window starting
-- nearest its start, if that has begun, else for the one holding it (as
-- tollgate-core's realigned; a start outside the bounds sent is left).
advance = function(i, p, s)
  local ws = window(now, p)
  if ws == s.a then return end
  -- A calendar window two periods or more ahead of now (the clock stepped
  -- back since it was written), which the bounds sent cannot place: moved
  -- to now's window, its count kept (as tollgate-core's advance).
  if p.bounds and s.a >= p.bounds[#p.bounds] then
    s.a = ws
    changed = true
    return
  end
  local os, oe = window_at(s.a, p)
  if os and os ~= s.a then
    local near = os
    if s.a - os > oe - s.a then near = oe end
    if near > now then near = os end
    s.a = near
    changed = true
  end
  if ws > s.a then s.a = ws; s.b = 0 end
end
status = function(i, p, s, qf)
  return max(p.count - s.b, 0), max(window_end(p, s) - now, 0)
end
admits = function(i, p, s, qf)
  if s.b + cost <= p.count then return nil end
  return max(window_end(p, s) - now, 0)
end
commit = function(i, p, s, qf) s.b = s.b + cost end
expires = function(i, p, s)
  if s.b == 0 then return 0 end
  return window_end(p, s)
end
charge = function(i, p, s, amount, qf) s.b = min(s.b + amount, MAX_SPAN) end
-- Only from the window the request was reserved in.
refund = function(i, p, s, amount, since)
  -- A time before the calendar periods sent is in a window before the
  -- key's (which holds now, or is later).
  if (window_at(since, p)) == s.a then s.b = s.b - min(amount, s.b) end
end
