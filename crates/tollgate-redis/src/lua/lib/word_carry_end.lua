  local flat = nil
  if not value then
    flat = redis.pcall('HGETALL', key)
    if flat.err then
      -- Neither a string nor a hash (a foreign writer's, under the
      -- prefix): no state of ours, as an empty hash, which an admission
      -- overwrites. A failure to pass on as it is (READONLY, OOM, ...) is
      -- raised.
      if not string.find(flat.err, '^WRONGTYPE') then error(flat) end
      flat = {}
    end
  end
  local alg = string.match(descriptor, '^(%S+)')
  local period, interval, cap = string.match(descriptor, '(%d+)/(%d+)/(%d+)')
  local p = { period = tonumber(period), interval = tonumber(interval), cap = tonumber(cap) }
  local S, whole = carry_over(alg, { p }, flat, value, now)
  if not S then return nil, true end
  if not S[1] then return nil, whole end
  return word_of(alg, p, S[1]), whole
end
