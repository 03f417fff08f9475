-- tollgate: extends a holder's lease of an in-flight slot
-- (SlotStore::renew), if it still holds one (see acquire.lua).
--
-- KEYS[1]  the key's slots
-- ARGV[1]  the holder
-- ARGV[2]  the lease in ms
--
-- Replies 1 if the lease was extended, 0 if the slot had expired.

local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local lease = tonumber(ARGV[2])
local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not ends or tonumber(ends) <= now then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease)
return 1
