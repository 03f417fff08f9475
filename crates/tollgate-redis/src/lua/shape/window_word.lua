-- tollgate: the decision script of window-word policies, each a single
-- fixed-window limit whose count is below half its period in µs
-- (Shape::WindowWord), after arith.lua and carry.lua. The whole
-- state of a key is one integer, the window word: the window's start in
-- µs plus the cost counted in it, stored as "0x<word>|<descriptor>" (see
-- carry.lua), the word in 15 hexadecimal digits, in a string that expires
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
-- KEYS[n+1]    (a settlement only, sent alone) the key's fence key, which a
--              refund reads (lib/fence.lua)
-- ARGV[i]      its request, "<mark><step><period><slack><descriptor>":
--              the mark '0', or '+' for a charge, or '-' for a refund, whose
--              step and slack are negative; the step, the period and the
--              slack in 14 hexadecimal digits each; then its policy's
--              descriptor (one argument per request, and numbers read
--              without converting a decimal: see tat.lua)
--   period     in µs
--   step       the cost, or 0 when nothing can be committed (a cost of 0,
--              or one above the count)
--   slack      count - cost, the most the window may hold already for the
--              request to be admitted; for a refund, 1 + when the request
--              was reserved (µs), which says in which window, and whether
--              before the fence of a reset or a block (lib/fence.lua)
--   descriptor a key written under another one (another count, or
--              another layout) is carried over and written back in this
--              one's terms, even when denied (a settlement, only where
--              it carries over whole: see lib/carry.lua)
-- ARGV[n+1]    (test clock only) now in µs since the Unix epoch; without it
--              the script reads Redis TIME
-- ARGV[n+2]    (test clock only) the shortest TTL to set, in ms
--
-- Replies now, as an integer, when no key held a count of its current
-- window (absent, or left over from an earlier window in the millisecond
-- it expires) and none was blocked: each request was decided as on a new
-- key. For one request whose key held a count, it replies the string
-- "<seconds> <microseconds> <word>", now as Redis TIME gave it and the word
-- as the key held it ("0x" and hexadecimal, or decimal): a table costs more
-- than a string made of strings at hand. Otherwise it replies an array of
-- integers: now, then each request's word before it (0 where the key held
-- no count of the current window, minus the end of the block for a key
-- blocked until then). The client
-- repeats the reference arithmetic (tollgate_core::state::decide_window_word)
-- on each word. A refund that the fence drops, or a settlement that
-- another configuration drops (a settlement is sent alone), changes
-- nothing and replies {now, word, 0}: three items, the word as above.
--
-- Per call: TIME. Per request: a GET, then, if admitted, a SET: of a new
-- window's word with its expiry, or of the counted word keeping its
-- expiry; a denial writes nothing (a refund that would change a word
-- also reads its fence key). Every number stays below 2^53, which
-- Lua doubles hold exactly; so does Lua's a % b (a - floor(a / b) * b):
-- the rounded quotient of a < 2^53 by b >= 1 never reaches the next
-- integer.

local call, try = redis.call, redis.pcall
-- Locals: a global costs a table lookup per use, a library's function two.
local KEYS, ARGV, type = KEYS, ARGV, type
local sub, byte, find, format = string.sub, string.byte, string.find, string.format
local ceil = math.ceil
-- The requests: a settlement, sent alone, also passes its fence key.
local n = state_keys
local real = ARGV[n + 1] == nil
local sec, usec, now, min_ttl
if real then
  local t = call('TIME')
  sec, usec = t[1], t[2]
  now = sec * 1000000 + usec
else
  now = tonumber(ARGV[n + 1])
  min_ttl = tonumber(ARGV[n + 2])
end

-- A write is spelled out where it happens, rather than in a function: a
-- closure over the locals above costs Redis an upvalue for each of them on
-- every call. A word is written under the descriptor, expiring when its
-- window ends at `ends` (at the millisecond rounded up, in the VM rather
-- than by a call), or (ends = nil) keeping the key's expiry. (Under a test
-- clock, whose time does not pass with Redis's, the TTL is relative and at
-- least min_ttl.)

-- Each request's word before it, for the reply's array; created only when
-- a key holds a count of its current window or is blocked.
local olds, only
-- The request read last, and its numbers (see tat.lua): a request equal to
-- the one before is not read again. The slack is read only when needed.
local last, step, refund, period, start, slack, descriptor
-- The word of a refund that the fence dropped, or of a settlement that
-- another configuration dropped, if any.
local held
for i = 1, n do
  local key = KEYS[i]
  local request = ARGV[i]
  if request ~= last then
    last, slack = request, nil
    -- The mark read with the step's digits: strtoul takes '0' as a digit,
    -- a leading '+' as nothing and a leading '-' as a negation modulo
    -- 2^64, far above any step; a charge is told from a decision only
    -- where it matters.
    step = tonumber(sub(request, 1, 15), 16)
    refund = step >= 9223372036854775808
    if refund then step = -tonumber(sub(request, 2, 15), 16) end
    period = tonumber(sub(request, 16, 29), 16)
    descriptor = sub(request, 44)
    start = now - now % period
  end
  local raw = try('GET', key)
  -- The time (word) the key held, carried over if it was written under
  -- another descriptor.
  -- The word to write, if any, and when its window ends (nil: keep the
  -- key's expiry).
  local old, carried, blocked, hex, write, ends = nil, false, nil, nil, nil, nil
  if raw then
    -- This version's layout: "0x", 15 digits, the bar at 18, the
    -- descriptor. (An error reply is a table, whose length is 0; an
    -- earlier version's decimal time below 2^53 has at most 16 digits,
    -- so its bar is never at 18.)
    if #raw - 18 == #descriptor and find(raw, descriptor, 19, true) then
      hex = sub(raw, 1, 17)
      old = tonumber(hex, 16)
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
        local word, whole = carried_word(key, raw, descriptor, now)
        if not whole and (refund or byte(request) == 43) then
          -- A settlement (a refund, or a charge: '+') of a key kept under
          -- a configuration that does not carry over whole changes
          -- nothing (see lib/carry.lua), and replies as a fenced refund
          -- does, with the word carried over.
          held = word or 0
        else
          old, carried = word, true
        end
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
  if blocked or held then
    -- Blocked, or a settlement another configuration dropped: nothing
    -- changes.
  elseif old and old >= start then
    -- A count of this window (or, after Redis's clock stepped back, of a
    -- later one, which the reference keeps too): admit if it leaves room.
    if not olds then
      olds = { now }
      for j = 1, i - 1 do olds[j + 1] = 0 end
    end
    olds[i + 1] = old
    only = hex
    if carried then ends = old - old % period + period end
    if not slack then
      slack = tonumber(sub(request, 30, 43), 16)
      if refund then slack = -slack end
    end
    if step ~= 0 and old % period <= slack then
      write = old + step
    elseif byte(request) == 43 then
      -- A charge past what the word holds: the window is full.
      write = start + period - 1
    elseif refund and -1 - slack - (-1 - slack) % period == start then
      -- A refund of a request reserved in this window, unless it was
      -- reserved before a reset's or a block's fence.
      if fenced and fenced(-1 - slack, now) then
        held = old
        if carried then write = old end
      else
        write = math.max(old + step, start)
      end
    elseif carried then
      write = old
    end
  else
    -- A new window: admit and write its start plus the step, expiring in
    -- the millisecond the window ends. A refund (a negative step) is of a
    -- window past, and changes nothing.
    if olds then olds[i + 1] = 0 end
    if step > 0 then
      write, ends = start + step, start + period
    elseif carried then
      call('DEL', key)
    end
  end
  if write then
    local value = format('0x%015x|', write) .. descriptor
    if not ends then
      call('SET', key, value, 'KEEPTTL')
    elseif real then
      call('SET', key, value, 'PXAT', format('%d', (ends + 999 - (ends + 999) % 1000) / 1000))
    else
      call('SET', key, value, 'PX', math.max(ceil((ends - now) / 1000), min_ttl))
    end
  end
end

if held then
  -- A settlement is sent alone.
  if n ~= 1 then error('tollgate: a dropped settlement among other requests') end
  return { now, held, 0 }
end
if n == 1 and olds and olds[2] >= 0 then
  -- One request's word: a string costs Redis less than a table, and the
  -- word is in hexadecimal as the key held it.
  if not real then
    sec = format('%d', (now - now % 1000000) / 1000000)
    usec = format('%d', now % 1000000)
  end
  return sec .. ' ' .. usec .. ' ' .. (only or format('%d', olds[2]))
end
if olds then
  return olds
end
return now
