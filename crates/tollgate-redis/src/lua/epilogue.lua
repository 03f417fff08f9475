-- tollgate: shared end of every decision script. Decides all limits
-- atomically, persists a committed change with its TTL, and replies
--   { outcome, now, delay, then per limit: remaining, reset, retry or -1 }
-- with outcome 0 = allowed, 1 = limited, 2 = cost above capacity.

for i = 1, n do
  if S[i] == nil then S[i] = init(i, P[i]) end
  advance(i, P[i], S[i])
end
local qf = queue_free()

local outcome, delay = 0, 0
local retry = {}
for i = 1, n do
  if cost > P[i].cap then outcome = 2 end
end
if outcome == 0 then
  for i = 1, n do
    retry[i] = admits(i, P[i], S[i], qf)
    if retry[i] ~= nil then outcome = 1 end
  end
end

local committed = outcome == 0 and cost > 0
if committed then
  for i = 1, n do commit(i, P[i], S[i], qf) end
  delay = max(qf - now, 0)
end
if committed or changed then
  local expiry = 0
  local fields = { 'fp', fp }
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
    redis.call('HSET', key, unpack(fields))
    -- On Redis's clock, expire at the absolute millisecond: Redis would
    -- rewrite a relative PEXPIRE into PEXPIREAT for its replicas anyway.
    -- Under a test clock the TTL is relative and at least min_ttl.
    local command, at = 'PEXPIREAT', fmt(math.ceil(expiry / 1000))
    if min_ttl > 0 then command, at = 'PEXPIRE', fmt(max(ttl, min_ttl)) end
    for j = 1, #KEYS do redis.call(command, KEYS[j], at) end
  else
    redis.call('DEL', unpack(KEYS))
  end
end
local reply = { outcome, now, delay }
if committed then qf = queue_free() end
for i = 1, n do
  local remaining, reset = status(i, P[i], S[i], qf)
  table.insert(reply, remaining)
  table.insert(reply, reset)
  table.insert(reply, retry[i] or -1)
end
return reply
