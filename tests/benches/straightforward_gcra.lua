-- The straightforward GCRA script a user would write first: the reference
-- of `cargo bench -p tollgate-tests --bench redis_cpu`.
--
-- KEYS[1] the TAT; ARGV: interval (µs), burst, cost.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new_tat = tat + cost * interval
local allow_at = new_tat - burst * interval
if allow_at > now then
  return { 0, 0, allow_at - now }
end
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', math.ceil((new_tat - now) / 1000))
return { 1, math.floor((now - allow_at) / interval), 0 }
