-- tollgate: extends a holder's lease of an in-flight slot
-- (SlotStore::renew), and takes the slot back if it is gone (see
-- acquire.lua): its lease ended, or Redis lost it (a restart without
-- persistence, FLUSHALL, a failover to a replica that missed writes).
-- The request still runs, so it counts again at once, past the limit if
-- new requests took every slot meanwhile: every running holder renewing
-- so makes the limit hold again for new requests within one renewal
-- period, as no new request takes a slot until fewer than the limit are
-- held.
--
-- KEYS[1]  the key's slots
-- ARGV[1]  the holder
-- ARGV[2]  the most slots
-- ARGV[3]  the lease in ms
--
-- Replies 1 if the lease was extended, 2 if the slot was gone and taken
-- back, 3 if it was gone and taken back past the limit.

local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local lease = tonumber(ARGV[3])

-- As in acquire.lua: the set lives as long as its longest lease.
local function live_as_long_as_the_longest_lease()
  local last = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[1], last[2])
end

local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
if ends and tonumber(ends) > now then
  redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[1])
  live_as_long_as_the_longest_lease()
  return 1
end
-- Gone: taken back once the ended leases (this holder's own among them)
-- are dropped, whatever the others hold.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
live_as_long_as_the_longest_lease()
if held >= tonumber(ARGV[2]) then
  return 3
end
return 2
