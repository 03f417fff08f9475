-- tollgate: extends a holder's lease of an in-flight slot
-- (SlotStore::renew), and takes the slot back if it is gone (see
-- acquire.lua): its lease ended, or Redis lost it (a restart without
-- persistence, FLUSHALL, a failover to a replica that missed writes).
-- The request still runs, so it counts again as soon as a slot is free:
-- every running holder renewing so makes the limit hold again for new
-- requests within one renewal period.
--
-- KEYS[1]  the key's slots
-- ARGV[1]  the holder
-- ARGV[2]  the most slots
-- ARGV[3]  the lease in ms
--
-- Replies 1 if the lease was extended, 2 if the slot was gone and taken
-- back, 0 if it was gone and every slot is held by others.

local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local lease = tonumber(ARGV[3])
local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
if ends and tonumber(ends) > now then
  redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], lease)
  return 1
end
-- Gone: taken back as acquire.lua takes a slot, if there is room once
-- the ended leases (this holder's own among them) are dropped.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
-- The set lives as long as its longest lease: this one, the newest.
redis.call('PEXPIRE', KEYS[1], lease)
return 2
