-- Sets or clears one override, and raises the version.
-- KEYS[1]: the hash of overrides; KEYS[2]: its version
-- ARGV[1]: the field (policy NUL kind NUL key bytes)
-- ARGV[2]: the value (expiry in µs, 0 for none, ';', the rule); '' clears
-- ARGV[3]: the TTL in ms both keys keep at least: past the override's
--          expiry, and never shortened
-- Returns the new version.
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
-- The next version is at least Redis's clock, in µs: a version lost or
-- rolled back with Redis's data (a restart without persistence, a
-- failover to a replica that missed writes), counted on by one, would
-- repeat versions callers saw with other overrides, and they would keep
-- their old table.
local t = redis.call('TIME')
local version = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1,
                         t[1] * 1000000 + t[2])
redis.call('SET', KEYS[2], string.format('%d', version), 'KEEPTTL')
local keep = tonumber(ARGV[3])
for _, key in ipairs(KEYS) do
  local ttl = redis.call('PTTL', key)
  if ttl ~= -2 and ttl < keep then
    redis.call('PEXPIRE', key, keep)
  end
end
return string.format('%d', version)
