-- tollgate: gives back a holder's slot of an in-flight limit
-- (SlotStore::release).
--
-- KEYS[1]  the key's slots (see acquire.lua)
-- KEYS[2]  the holders given back while they held no slot, each scored by
--          when it is forgotten, in ms on Redis's clock
-- ARGV[1]  the holder
-- ARGV[2]  the lease in ms
--
-- Replies 1 if the holder held a slot, else 0.
--
-- A holder that held no slot may have its acquire still on its way: a
-- request dropped while its slot was being taken gives it back at once,
-- and on a pool, or on a connection replaced after an error, the give-back
-- can reach Redis first. That acquire would take a slot that no one holds
-- and no one renews, counted against the key for a whole lease. So the
-- holder is remembered for a lease, and acquire.lua refuses it. A
-- release finds its slot gone only in that race, when the slot's lease
-- ended, when Redis lost it (a flush, a restart, a failover: then every
-- running request's holder is remembered), or when an earlier try of this
-- release was applied: at most the key's requests of one lease.

if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  return 1
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZREVRANGE', KEYS[2], 0, 0, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[2], last[2])
return 0
