-- tollgate: carrying a key over to a word script's configuration. The
-- library of arith.lua and carry.lua follows inside this one function, so
-- that a call pays for it only when a key changed configuration.
--
-- The word of `key` under `descriptor` (a single limit), carried over from
-- `value`, the string it holds under another configuration, or (value =
-- nil) from its hash; nil when nothing carries over. Then whether the
-- carry is whole (see carry_over): true for a key holding no state.
local function carried_word(key, value, descriptor, now)
