-- Adds one batch of a flush to one key's usage buckets, which share a
-- hash tag (and so a cluster slot), at most once. KEYS[1] is the key's
-- marker for this instance: the sequence number of the last batch of it
-- applied. ARGV[1] is this batch's sequence number, ARGV[2] the marker's
-- TTL in ms. KEYS[i] (i >= 2) is a bucket; ARGV[2i-1] the units to add
-- (negative for refunds), ARGV[2i] its TTL in ms. A bucket holds -2^62
-- to 2^62 units, saturating beyond, and is read as 0 while below 0: a
-- refund that another instance flushed before the record it settles
-- (that instance's flush came first) is kept, as the memory ledger keeps
-- it, until the record lands. A batch whose reply was lost, sent again
-- with its number, finds the marker at or past it and adds nothing.
-- Returns how many buckets it wrote, -1 for a batch applied before.
local seq = tonumber(ARGV[1])
local last = redis.call('GET', KEYS[1])
if last and tonumber(last) >= seq then
  return -1
end
local max = 4611686018427387904
for i = 2, #KEYS do
  local key = KEYS[i]
  local units = ARGV[2 * i - 1]
  local ok, sum = pcall(redis.call, 'INCRBY', key, units)
  -- INCRBY fails past 64 bits, in the direction of the units added.
  if not ok then
    sum = string.sub(units, 1, 1) == '-' and -2 * max or 2 * max
  end
  if sum > max then
    redis.call('SET', key, '4611686018427387904')
  elseif sum < -max then
    redis.call('SET', key, '-4611686018427387904')
  end
  redis.call('PEXPIRE', key, ARGV[2 * i])
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return #KEYS - 1
