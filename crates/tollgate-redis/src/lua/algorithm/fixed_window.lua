-- Fixed window: a = window start, b = cost counted in it. Windows are
-- multiples of the period, or calendar periods (see window() in the
-- prelude).
-- A window ends as long after its start as the window holding its start
-- (as FixedWindow::end): that window's end for a start on a boundary; for
-- one begun under another calendar (a zone or offset changed since), the
-- end of a window as long, so that its count holds until then.
local function window_end(p, s)
  local ws, we = window(s.a, p)
  return s.a + (we - ws)
end
init = function(i, p) return { a = (window(now, p)), b = 0, c = 0 } end
-- Over when the current window starts after it and it has ended, or when
-- it began before the calendar periods sent (as FixedWindow::over). An
-- empty window is as good as a fresh one.
advance = function(i, p, s)
  local ws = window(now, p)
  if s.b == 0 then s.a = ws; return end
  if ws <= s.a then return end
  local os, oe = window_at(s.a, p)
  if not os or now >= s.a + (oe - os) then s.a = ws; s.b = 0 end
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
  if since >= s.a and since < window_end(p, s) then s.b = s.b - min(amount, s.b) end
end
