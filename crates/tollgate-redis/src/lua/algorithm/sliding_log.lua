-- Sliding log: the log of limit i is the sorted set KEYS[1 + i], one member
-- "<time>:<cost>:<seq>" scored by time per admitted request.
-- a = the sum of the log's costs, b = the newest entry's time, s = sequence.
local function parse(member)
  local t, c = string.match(member, '^(%d+):(%d+):')
  return num(t), num(c)
end
init = function(i, p)
  -- Entries of another configuration are dropped (not by a settlement
  -- that changes nothing of it: see carry.lua).
  if not adrift then redis.call('DEL', KEYS[1 + i]) end
  return { a = 0, b = 0, c = 0, s = 0 }
end
advance = function(i, p, s)
  if s.a == 0 then return end
  local cutoff = fmt(now - p.period)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1 + i], '-inf', cutoff)
  if #gone > 0 then
    for _, m in ipairs(gone) do
      local _, c = parse(m)
      s.a = s.a - c
    end
    -- Kept by a refund that changes nothing of the key: its hash still
    -- counts them.
    if not adrift then redis.call('ZREMRANGEBYSCORE', KEYS[1 + i], '-inf', cutoff) end
    changed = true
  end
end
status = function(i, p, s, qf)
  if s.a == 0 then return p.count, 0 end
  return max(p.count - s.a, 0), max(s.b + p.period - now, 0)
end
admits = function(i, p, s, qf)
  if s.a + cost <= p.count then return nil end
  local need = s.a + cost - p.count
  local freed = 0
  for _, m in ipairs(redis.call('ZRANGE', KEYS[1 + i], 0, -1)) do
    local t, c = parse(m)
    freed = freed + c
    if freed >= need then return max(t + p.period - now, 0) end
  end
  return 0
end
commit = function(i, p, s, qf)
  local at = now
  if s.a > 0 then at = max(now, s.b) end
  s.s = s.s + 1
  redis.call('ZADD', KEYS[1 + i], fmt(at), fmt(at) .. ':' .. fmt(cost) .. ':' .. fmt(s.s))
  s.a = s.a + cost
  s.b = at
end
expires = function(i, p, s)
  if s.a == 0 then return 0 end
  return s.b + p.period
end
-- A charge is an entry like a request's.
charge = function(i, p, s, amount, qf)
  amount = min(amount, MAX_SPAN - s.a)
  if amount <= 0 then return end
  local saved = cost
  cost = amount
  commit(i, p, s, qf)
  cost = saved
end
-- From the entries recorded at `since`, the reserved request's own time
-- (as tollgate-core's sliding log): once they have aged out its units are
-- gone, and later entries are other requests'.
refund = function(i, p, s, amount, since)
  if s.a == 0 then return end
  local log = KEYS[1 + i]
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', log, fmt(since), fmt(since))) do
    if amount <= 0 then break end
    local t, c = parse(m)
    local taken = min(amount, c)
    redis.call('ZREM', log, m)
    if taken < c then
      s.s = s.s + 1
      redis.call('ZADD', log, fmt(t), fmt(t) .. ':' .. fmt(c - taken) .. ':' .. fmt(s.s))
    end
    amount = amount - taken
    s.a = s.a - taken
  end
  if s.a == 0 then
    s.b = 0
  else
    s.b = num(redis.call('ZREVRANGE', log, 0, 0, 'WITHSCORES')[2])
  end
end
