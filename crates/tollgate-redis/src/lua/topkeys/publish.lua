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
-- Instances that stopped publishing leave the index with their hash,
-- which expires after three of their own intervals: one that publishes
-- less often than this one is kept while its hash lives. (Each hash sits
-- beside the index, in its cluster slot.)
local stem = string.sub(KEYS[1], 1, #KEYS[1] - #'instances')
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - ttl)) do
  if redis.call('EXISTS', stem .. 'i' .. member) == 0 then
    redis.call('ZREM', KEYS[1], member)
  end
end
-- The index lives as long as the longest-lived publication in it.
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
