  local flat = nil
  if not value then flat = redis.call('HGETALL', key) end
  local alg = string.match(descriptor, '^(%S+)')
  local period, interval, cap = string.match(descriptor, '(%d+)/(%d+)/(%d+)')
  local p = { period = tonumber(period), interval = tonumber(interval), cap = tonumber(cap) }
  local S, whole = carry_over(alg, { p }, flat, value, now)
  if not S then return nil, true end
  if not S[1] then return nil, whole end
  return word_of(alg, p, S[1]), whole
end
