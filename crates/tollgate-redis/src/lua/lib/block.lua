-- tollgate: an operator's block (Store::block, see block.lua), shared by
-- every decision script. A blocked key's state key holds the string
-- "<until>|blocked", which no descriptor matches: a script meets it only
-- where it finds a key of another configuration, off the path of every
-- other decision.
--
-- When the block `value` ends (µs), or nil if it is no block.
local function block_end(value)
  if type(value) ~= 'string' then return nil end
  local ends = string.match(value, '^(%d+)|blocked$')
  return ends and tonumber(ends)
end
