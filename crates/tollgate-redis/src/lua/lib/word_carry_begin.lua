-- tollgate: carrying a key over to a word script's configuration. The
-- library of arith.lua and carry.lua follows inside this one function, so
-- that a call pays for it only when a key changed configuration.
--
-- The word of `key` under `descriptor` (a single limit), carried over from
-- `value`, the string it holds under another configuration, or (value =
-- nil) from its hash; nil when nothing carries over.
local function carried_word(key, value, descriptor, now)
