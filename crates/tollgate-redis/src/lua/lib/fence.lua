-- tollgate: the fence of a reset or a block (Store::reset, Store::block;
-- see tollgate-core's Settlement), shared by block.lua and every decision
-- script. Forgetting a key's state gives back every unit reserved before
-- it, so a refund of a request reserved then would give its units back a
-- second time, to the fresh state. block.lua writes "<at> <until>" (µs)
-- to the key's fence key, expiring at `until`; until then, a refund of a
-- request reserved at or before `at` changes nothing. Only a refund that
-- would change a state reads the fence: no decision does.
--
-- The fence key of the state key `key`: it keeps the state key's hash
-- tag, and so its cluster slot.
local function fence_key(key) return key .. ':fence' end
-- Whether the fence of the state key `key` drops, at `now`, a refund of a
-- request reserved at `since` (µs).
local function fenced(key, since, now)
  local value = redis.call('GET', fence_key(key))
  if type(value) ~= 'string' then return false end
  local at, ends = string.match(value, '^(%d+) (%d+)$')
  return at ~= nil and since <= tonumber(at) and now < tonumber(ends)
end
