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
-- A version lost with Redis's data (a restart without persistence, a
-- failover to a replica that missed writes) starts again from Redis's
-- clock, in µs: counted from 0 again, it would repeat versions callers
-- saw with other overrides, and they would keep their old table.
if redis.call('EXISTS', KEYS[2]) == 0 then
  local t = redis.call('TIME')
  redis.call('SET', KEYS[2], string.format('%d', t[1] * 1000000 + t[2]))
end
local version = redis.call('INCR', KEYS[2])
local keep = tonumber(ARGV[3])
for _, key in ipairs(KEYS) do
  local ttl = redis.call('PTTL', key)
  if ttl ~= -2 and ttl < keep then
    redis.call('PEXPIRE', key, keep)
  end
end
return version
