-- tollgate: the decision script of window-word policies, each a single
-- fixed-window limit whose count is below its period in µs
-- (Shape::WindowWord), after arith.lua and carry.lua. The whole
-- state of a key is one integer, the window word: the window's start in
-- µs plus the cost counted in it, stored as "0x<word>|<descriptor>" (see
-- carry.lua), the word in 14 hexadecimal digits, in a string that expires
-- when the window ends. As the count never reaches the period, the word's
-- window is the word rounded down to a multiple of the period, and its
-- count is the rest. Smaller than the general script: no hash and no
-- reply table.
--
-- One call decides one request per key, in the order of KEYS, all at the
-- same `now`: the store sends one key per call when it is idle, and under
-- concurrent load the requests that queued meanwhile in one call (the same
-- key may stand more than once, and is decided in turn). Each request
-- carries its own argument, so requests of different policies mix.
--
-- KEYS[i]      the state key of request i, 1 <= i <= n
-- ARGV[i]      its request, "<mark><period><step><slack><descriptor>":
--              the mark '0', or '+' for a charge, or '-' for a refund, whose
--              step and slack are negative; the period, the step and the
--              slack in 14 hexadecimal digits each; then its policy's
--              descriptor (one argument per request, and numbers read
--              without converting a decimal: see tat.lua)
--   period     in µs
--   step       the cost, or 0 when nothing can be committed (a cost of 0,
--              or one above the count)
--   slack      count - cost, the most the window may hold already for the
--              request to be admitted
--   descriptor a key written under another one (another count, or
--              another layout) is carried over and written back in this
--              one's terms, even when denied
-- ARGV[n+1]    (test clock only) now in µs since the Unix epoch; without it
--              the script reads Redis TIME
-- ARGV[n+2]    (test clock only) the shortest TTL to set, in ms
--
-- Replies now, as an integer, when no key held a count of its current
-- window (absent, or left over from an earlier window in the millisecond
-- it expires) and none was blocked: each request was decided as on a new
-- key. Otherwise it replies an array of integers: now, then each request's
-- word before it (0 where the key held no count of the current window,
-- minus the end of the block for a key blocked until then). The client
-- repeats the reference arithmetic (tollgate_core::state::decide_window_word)
-- on each word.
--
-- Per call: TIME. Per request: a GET, then, if admitted, a SET: of a new
-- window's word with its expiry, or of the counted word keeping its
-- expiry; a denial writes nothing. Every number stays below 2^53, which
-- Lua doubles hold exactly; so does Lua's a % b (a - floor(a / b) * b):
-- the rounded quotient of a < 2^53 by b >= 1 never reaches the next
-- integer.

local call, try = redis.call, redis.pcall
-- Locals: a global costs a table lookup per use, a library's function two.
local KEYS, ARGV, type = KEYS, ARGV, type
local sub, byte, find, format = string.sub, string.byte, string.find, string.format
local ceil = math.ceil
local n = #KEYS
local real = ARGV[n + 1] == nil
local now, min_ttl
if real then
  local t = call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(ARGV[n + 1])
  min_ttl = tonumber(ARGV[n + 2])
end

-- Writes `word` under `descriptor`, expiring when its window ends at
-- `ends`, or (ends = nil) keeping the key's expiry. (Under a test clock,
-- whose time does not pass with Redis's, the TTL is relative and at least
-- min_ttl.)
local function put(key, word, descriptor, ends)
  local value = format('0x%014x|', word) .. descriptor
  if not ends then
    return call('SET', key, value, 'KEEPTTL')
  elseif real then
    return call('SET', key, value, 'PXAT', format('%d', ceil(ends / 1000)))
  end
  return call('SET', key, value, 'PX', math.max(ceil((ends - now) / 1000), min_ttl))
end

-- Each request's word before it, for the reply's array; created only when
-- a key holds a count of its current window or is blocked.
local olds
for i = 1, n do
  local key = KEYS[i]
  local request = ARGV[i]
  local mark = byte(request)
  local period = tonumber(sub(request, 2, 15), 16)
  local step = tonumber(sub(request, 16, 29), 16)
  if mark == 45 then step = -step end
  local descriptor = sub(request, 44)
  local start = now - now % period
  local raw = try('GET', key)
  -- The time (word) the key held, carried over if it was written under
  -- another descriptor.
  local old, carried, blocked = nil, false, nil
  if raw then
    -- This version's layout: "0x", 14 digits, the bar, the descriptor.
    if type(raw) == 'string' and byte(raw, 2) == 120 and #raw - 17 == #descriptor
        and find(raw, descriptor, 18, true) then
      old = tonumber(sub(raw, 1, 16), 16)
    else
      if type(raw) == 'table' then
        -- A hash (the key was kept by the general script), or a failure
        -- to pass on as it is (READONLY, OOM, ...).
        if not find(raw.err, '^WRONGTYPE') then error(raw) end
        raw = nil
      end
      -- An earlier version's layout (the word in decimal), another
      -- descriptor, a block or a hash: carried_word reads them all.
      blocked = block_end(raw)
      if not blocked then
        old, carried = carried_word(key, raw, descriptor, now), true
      elseif blocked <= now then
        -- A block that has ended: as a key never seen.
        blocked = nil
      else
        if not olds then
          olds = { now }
          for j = 1, i - 1 do olds[j + 1] = 0 end
        end
        olds[i + 1] = -blocked
      end
    end
  end
  if blocked then
    -- Blocked: nothing changes.
  elseif old and old >= start then
    -- A count of this window (or, after Redis's clock stepped back, of a
    -- later one, which the reference keeps too): admit if it leaves room.
    if not olds then
      olds = { now }
      for j = 1, i - 1 do olds[j + 1] = 0 end
    end
    olds[i + 1] = old
    local ends = nil
    if carried then ends = old - old % period + period end
    local slack = tonumber(sub(request, 30, 43), 16)
    if mark == 45 then slack = -slack end
    if step ~= 0 and old % period <= slack then
      put(key, old + step, descriptor, ends)
    elseif mark == 43 then
      -- A charge past what the word holds: the window is full.
      put(key, start + period - 1, descriptor, ends)
    elseif mark == 45 and -1 - slack == start then
      -- A refund of a request reserved in this window.
      put(key, math.max(old + step, start), descriptor, ends)
    elseif carried then
      put(key, old, descriptor, ends)
    end
  else
    -- A new window: admit and write its start plus the step, expiring in
    -- the millisecond the window ends.
    if olds then olds[i + 1] = 0 end
    if step ~= 0 then
      put(key, start + step, descriptor, start + period)
    elseif carried then
      call('DEL', key)
    end
  end
end

if olds then
  return olds
end
return now
