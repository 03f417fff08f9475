-- Fixed window: a = window start, b = cost counted in it. Windows are
-- multiples of the period, or calendar periods (see window() in the
-- prelude); a window ends where the window holding its start ends.
local function window_end(p, s)
  local _, e = window(s.a, p)
  return e
end
init = function(i, p) return { a = (window(now, p)), b = 0, c = 0 } end
-- A window begun before the current one's start ws runs into it if, as
-- long as the window holding its start, it ends after ws: never for one
-- begun on a boundary; for one begun under another calendar (a zone or
-- offset changed since), its count carries into the current window (as
-- FixedWindow::runs_into). Judged from the periods sent only.
advance = function(i, p, s)
  local ws = window(now, p)
  if ws > s.a then
    local os, oe = window_at(s.a, p)
    if not (os and s.a + (oe - os) > ws) then s.b = 0 end
    s.a = ws
  end
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
