-- Publishes one instance's top keys, replacing what it published before.
-- KEYS[1]: the index of instances (a sorted set, scored by Redis's time
--          of their last publication, in ms)
-- KEYS[2]: this instance's hash: one field per policy and ranking
-- ARGV[1]: how long a publication lives, in ms
-- ARGV[2]: how long any instance's publication lives at most, in ms (at
--          the longest interval)
-- ARGV[3]: this instance's member in the index
-- ARGV[4..]: field, value, field, value, ...
local ttl = tonumber(ARGV[1])
local longest = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('DEL', KEYS[2])
for i = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('ZADD', KEYS[1], now, ARGV[3])
-- Instances that stopped publishing leave the index once no publication
-- of theirs can live any more: instances may publish at other intervals
-- than this one's, and one publishing less often stays while its hash
-- does. (A reader skips a member whose hash has expired.)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - longest)
-- The index lives as long as the longest-lived publication in it.
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
