-- Adds a flush's units to one key's usage buckets, which share a hash
-- tag (and so a cluster slot). KEYS[i] is a bucket; ARGV[2i-1] the units
-- to add (negative for refunds), ARGV[2i] its TTL in ms. A bucket holds 0
-- to 2^62 units: beyond, it saturates. Returns how many buckets it wrote.
local max = '4611686018427387904'
for i, key in ipairs(KEYS) do
  local ok, sum = pcall(redis.call, 'INCRBY', key, ARGV[2 * i - 1])
  if not ok or sum > 4611686018427387904 then
    redis.call('SET', key, max)
  elseif sum < 0 then
    redis.call('SET', key, '0')
  end
  redis.call('PEXPIRE', key, ARGV[2 * i])
end
return #KEYS
