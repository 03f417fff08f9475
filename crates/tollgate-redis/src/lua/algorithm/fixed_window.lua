-- Fixed window: a = window start, b = cost counted in it. Windows are
-- multiples of the period, or calendar periods (see window() in the
-- prelude).
-- A window ends at the end of the window starting nearest its start (as
-- FixedWindow::end): the end of the window it began, for a start on a
-- boundary; for one begun under another calendar (a zone or offset
-- changed since), the end of the window of this one that stands for it.
-- A next window beyond the periods sent (a clock a period away from the
-- sender's) is not looked for.
local function stands_for(p, s)
  local ws, we = window(s.a, p)
  if s.a - ws <= we - s.a then return ws, we end
  local ns, ne = window_at(we, p)
  if not ns then return ws, we end
  return ns, ne
end
local function window_end(p, s)
  local _, e = stands_for(p, s)
  return e
end
init = function(i, p) return { a = (window(now, p)), b = 0, c = 0 } end
-- Over when the current window starts after it and it has ended, or when
-- it began before the calendar periods sent (as FixedWindow::over). An
-- empty window is as good as a fresh one.
advance = function(i, p, s)
  local ws = window(now, p)
  if s.b == 0 then s.a = ws; return end
  if ws <= s.a then return end
  if not window_at(s.a, p) or now >= window_end(p, s) then s.a = ws; s.b = 0 end
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
  local ws, we = stands_for(p, s)
  if since >= ws and since < we then s.b = s.b - min(amount, s.b) end
end
