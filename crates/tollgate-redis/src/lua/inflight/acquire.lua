-- tollgate: takes a slot of an in-flight limit (SlotStore::acquire). The
-- slots of one key are a sorted set: each holder scored by when its lease
-- ends, in ms on Redis's clock. Slots whose lease has ended are dropped
-- first: their holders died, or stopped renewing.
--
-- KEYS[1]  the key's slots
-- KEYS[2]  the holders given back while they held no slot (release.lua)
-- ARGV[1]  the holder
-- ARGV[2]  the most slots
-- ARGV[3]  the lease in ms
--
-- Replies { 1 if the holder took a slot else 0, the slots held now }.

local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local lease = tonumber(ARGV[3])

-- The set lives as long as its longest lease, whoever holds it: holders
-- of one limit's name may have leases of different lengths (a deploy
-- that changes the lease), and a shorter one must not end the others.
local function live_as_long_as_the_longest_lease()
  local last = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[1], last[2])
end

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
-- A holder given back before this call arrived takes nothing: its request
-- is gone (see release.lua).
local gone = redis.call('ZSCORE', KEYS[2], ARGV[1])
if gone and tonumber(gone) > now then
  return { 0, held }
end
-- A holder that holds a slot already keeps it, its lease extended.
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
  live_as_long_as_the_longest_lease()
  return { 1, held }
end
if held >= tonumber(ARGV[2]) then
  return { 0, held }
end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
live_as_long_as_the_longest_lease()
return { 1, held + 1 }
