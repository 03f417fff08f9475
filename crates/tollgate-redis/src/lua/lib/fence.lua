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
-- A call that may read or write a fence passes the fence key last, after
-- the state keys: the first key's name and ':fence' (a state key ends with
-- '}' and a sliding log's with a digit, so only a last key ending with 'e'
-- is compared). The number of other keys, and the fence key or nil:
local function keys_and_fence()
  local n = #KEYS
  local last = KEYS[n]
  if n > 1 and string.byte(last, -1) == 101 and last == KEYS[1] .. ':fence' then
    return n - 1, last
  end
  return n, nil
end
-- Whether the fence `fence` (a key, or nil) drops, at `now`, a refund of a
-- request reserved at `since` (µs).
local function fenced(fence, since, now)
  if not fence then return false end
  local value = redis.call('GET', fence)
  if type(value) ~= 'string' then return false end
  local at, ends = string.match(value, '^(%d+) (%d+)$')
  return at ~= nil and since <= tonumber(at) and now < tonumber(ends)
end
