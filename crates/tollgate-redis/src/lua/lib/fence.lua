-- tollgate: the fence of a reset or a block (Store::reset, Store::block;
-- see tollgate-core's Settlement), shared by block.lua and every decision
-- script. Forgetting a key's state gives back every unit reserved before
-- it, so a refund of a request reserved then would give its units back a
-- second time, to the fresh state. block.lua writes "<at> <until>" (µs)
-- to the key's fence key, `<state key>:fence`, expiring at `until`: until
-- then, a refund of a request reserved at or before `at` (the reset's
-- time) changes nothing. Refunds read it, and the next reset or block
-- (which keeps the later end); never a decision.
--
-- A call that may read or write a fence (a settlement, sent alone, or a
-- reset or block) passes the fence key last, after the state keys: the
-- first key's name and ':fence'. A state key ends with '}' and a sliding
-- log's with a digit, so only a last key ending with 'e' is compared.

-- The call's keys before its fence key, and the fence key or nil.
local state_keys, fence_key = #KEYS, nil
do
  local last = KEYS[state_keys]
  if state_keys > 1 and string.byte(last, -1) == 101 and last == KEYS[1] .. ':fence' then
    state_keys, fence_key = state_keys - 1, last
  end
end
-- Whether the fence drops, at `now`, a refund of a request reserved at
-- `since` (µs): defined only for a call that passes a fence key, so that
-- no decision pays for making the function.
local fenced = nil
if fence_key then
  fenced = function(since, now)
    local value = redis.call('GET', fence_key)
    if type(value) ~= 'string' then return false end
    local at, ends = string.match(value, '^(%d+) (%d+)$')
    return at ~= nil and since <= tonumber(at) and now < tonumber(ends)
  end
end
