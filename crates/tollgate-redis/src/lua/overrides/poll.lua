-- Reads the overrides if they changed since the caller last saw them.
-- KEYS[1]: the hash of overrides (field: policy NUL kind NUL key bytes;
--          value: expiry in µs, 0 for none, then ';' and the rule)
-- KEYS[2]: its version, raised by every change
-- ARGV[1]: the version the caller last saw ('' for none)
-- ARGV[2]: now in µs by the caller's clock, to drop the overrides expired
--          by then; 0 to drop none
-- ARGV[3]: the TTL in ms both keys keep at least; 0 to leave them
-- Returns {version} when unchanged, {version, {field, value, ...}} when not.
local now = tonumber(ARGV[2])
if now > 0 then
  local all = redis.call('HGETALL', KEYS[1])
  local dropped = 0
  for i = 1, #all, 2 do
    local ends = tonumber(string.match(all[i + 1], '^(%d+);'))
    if ends and ends > 0 and ends <= now then
      redis.call('HDEL', KEYS[1], all[i])
      dropped = dropped + 1
    end
  end
  if dropped > 0 then
    -- At least Redis's clock, as write.lua's.
    local t = redis.call('TIME')
    local version = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1,
                             t[1] * 1000000 + t[2])
    redis.call('SET', KEYS[2], string.format('%d', version), 'KEEPTTL')
    -- A version made again here (it was lost) lives as long as its hash,
    -- or a day if the hash is gone.
    if redis.call('PTTL', KEYS[2]) == -1 then
      local ttl = redis.call('PTTL', KEYS[1])
      if ttl <= 0 then ttl = 86400000 end
      redis.call('PEXPIRE', KEYS[2], ttl)
    end
  end
end
local keep = tonumber(ARGV[3])
if keep > 0 then
  for _, key in ipairs(KEYS) do
    if redis.call('PTTL', key) ~= -2 and redis.call('PTTL', key) < keep then
      redis.call('PEXPIRE', key, keep)
    end
  end
end
local version = redis.call('GET', KEYS[2]) or '0'
if version == ARGV[1] then
  return {version}
end
return {version, redis.call('HGETALL', KEYS[1])}
