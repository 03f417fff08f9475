-- Publishes one instance's top keys, replacing what it published before.
-- KEYS[1]: the index of instances (a sorted set, scored by Redis's time
--          of their last publication, in ms)
-- KEYS[2]: this instance's hash: one field per policy and ranking
-- ARGV[1]: how long a publication lives, in ms
-- ARGV[2]: this instance's member in the index
-- ARGV[3..]: field, value, field, value, ...
local ttl = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('DEL', KEYS[2])
for i = 3, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('ZADD', KEYS[1], now, ARGV[2])
-- Instances that stopped publishing leave the index with their hash.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
