-- tollgate: shared end of every general decision script. Decides each
-- request of the call in turn (one or more requests of one key, see
-- ARGV[2]), all limits atomically, persists a committed change with its
-- TTL, and replies per request
--   outcome, now, delay, then per limit: remaining, reset, retry or -1
-- with outcome 0 = allowed, 1 = limited, 2 = cost above capacity, 3 =
-- limited by an operator's block. A settlement's reply is that of an
-- allowed request, with the state after it; a blocked key's is a denial
-- until the block ends (outcome 3).

for i = 1, n do
  if S[i] == nil then S[i] = init(i, P[i]) end
  advance(i, P[i], S[i])
end
-- Each request in turn, at the same `now`.
local reply = {}
local committed = false
for each in string.gmatch(costs, '%S+') do
  local sign = string.byte(each)
  if blocked then
    -- Denied until the block ends, whatever the request.
    local rest = blocked - now
    reply[#reply + 1] = 3
    reply[#reply + 1] = now
    reply[#reply + 1] = 0
    for i = 1, n do
      reply[#reply + 1] = 0
      reply[#reply + 1] = rest
      reply[#reply + 1] = rest
    end
  elseif sign == 43 or sign == 45 then
    -- A settlement: charged or refunded on every limit, never denied.
    local qf = queue_free()
    local amount, since = string.match(each, '^.(%d+)@?(%d*)$')
    amount = num(amount)
    -- A refund behind a reset's or a block's fence, or a settlement of a
    -- key kept under another configuration, changes nothing.
    if not adrift and (sign == 43 or not (fenced and fenced(num(since), now))) then
      for i = 1, n do
        if sign == 43 then charge(i, P[i], S[i], amount, qf)
        else refund(i, P[i], S[i], amount, num(since)) end
      end
    end
    committed = true
    qf = queue_free()
    reply[#reply + 1] = 0
    reply[#reply + 1] = now
    reply[#reply + 1] = 0
    for i = 1, n do
      local remaining, reset = status(i, P[i], S[i], qf)
      reply[#reply + 1] = remaining
      reply[#reply + 1] = reset
      reply[#reply + 1] = -1
    end
  else
    cost = tonumber(each)
    local qf = queue_free()
    local outcome, delay = 0, 0
    local retry = {}
    for i = 1, n do
      if cost > P[i].cap then outcome = 2 end
    end
    -- A peek (cost 0) is never denied, not even by a limit in carried-over
    -- debt.
    if outcome == 0 and cost > 0 then
      for i = 1, n do
        retry[i] = admits(i, P[i], S[i], qf)
        if retry[i] ~= nil then outcome = 1 end
      end
    end
    if outcome == 0 and cost > 0 then
      for i = 1, n do commit(i, P[i], S[i], qf) end
      delay = max(qf - now, 0)
      committed = true
      qf = queue_free()
    end
    reply[#reply + 1] = outcome
    reply[#reply + 1] = now
    reply[#reply + 1] = delay
    for i = 1, n do
      local remaining, reset = status(i, P[i], S[i], qf)
      reply[#reply + 1] = remaining
      reply[#reply + 1] = reset
      reply[#reply + 1] = retry[i] or -1
    end
  end
end

if not blocked and not adrift and (committed or changed) then
  local expiry = 0
  local fields = { 'c', descriptor }
  local names = { 'a', 'b', 'c', 's' }
  for i = 1, n do
    local s = S[i]
    for j = 1, 4 do
      local f = names[j]
      fields[#fields + 1] = i .. f
      fields[#fields + 1] = fmt(s[f] or 0)
    end
    expiry = max(expiry, expires(i, P[i], S[i]))
  end
  local ttl = math.ceil((expiry - now) / 1000)
  if ttl > 0 then
    if was_string then redis.call('DEL', key) end
    redis.call('HSET', key, unpack(fields))
    -- On Redis's clock, expire at the absolute millisecond: Redis would
    -- rewrite a relative PEXPIRE into PEXPIREAT for its replicas anyway.
    -- Under a test clock the TTL is relative and at least min_ttl.
    local command, at = 'PEXPIREAT', fmt(math.ceil(expiry / 1000))
    if min_ttl > 0 then command, at = 'PEXPIRE', fmt(max(ttl, min_ttl)) end
    for j = 1, state_keys do redis.call(command, KEYS[j], at) end
  else
    redis.call('DEL', unpack(KEYS, 1, state_keys))
  end
end
return reply
