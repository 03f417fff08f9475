-- tollgate: the decision script of one-time policies, each a single GCRA,
-- token-bucket or leaky-bucket limit (after arith.lua and carry.lua). The
-- whole state of a key is one time in microseconds (the theoretical
-- arrival time, when the bucket is full again, or when the queue is next
-- free), stored as "0x<time>|<descriptor>" (see carry.lua), the time in 15
-- hexadecimal digits, in a string that expires exactly then. Smaller than
-- the general script: no hash and no reply table.
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
-- ARGV[i]      its request, "<sign><step><slack><descriptor>": the sign
--              '0' (or '+', alike), or '-' for a negative step; the step
--              and the slack in 14 hexadecimal digits each; then its
--              policy's descriptor
--   step       cost x interval in µs, how far an admitted request moves
--              the time; 0 when nothing can be committed (a cost of 0 or
--              one above capacity)
--   slack      (capacity - cost) x interval in µs, how far ahead of now the
--              time may be for the request to be admitted
--              A settlement (Store::settle), always read first, is
--              marked by its slack of 2^50, which no request has (its
--              step and slack add up to capacity x interval, at most
--              2^50): a step of cost x interval charges, saturating at
--              2^50 ahead of now; a negative step refunds (the time never
--              goes back past now, and a time that has passed means no
--              backlog); a refund's slack is 2^50 plus when the request
--              was reserved (µs), for the fence of a reset or a block
--              (lib/fence.lua)
--   descriptor a key written under another one (another count or burst,
--              or another layout) is carried over and written back in this
--              one's terms, even when denied (a settlement, only where
--              it carries over whole: see lib/carry.lua)
-- ARGV[n+1]    (test clock only) now in µs since the Unix epoch; without it
--              the script reads Redis TIME
-- ARGV[n+2]    (test clock only) the shortest TTL to set, in ms
--
-- One argument per request, and numbers Lua reads without converting a
-- decimal: each argument costs Redis a string and a slot in a table that
-- grows as it fills, and tonumber of a decimal string runs the C library's
-- strtod, where a hexadecimal one runs the cheaper strtoul. The time is
-- stored in hexadecimal for the same reason; "0x" keeps it readable by
-- tonumber() alone, so that scripts of earlier versions, which stored it
-- in decimal, read it too (and this one reads theirs).
--
-- The store sends this file after a first line that sets write_first,
-- `local write_first = true` or `false` (see below): two scripts with two
-- SHA-1s, rather than one more argument.
--
-- Replies now, as a positive integer, when no key's time was ahead of now
-- (the usual case: an idle key has expired, or its time has passed). For
-- one key whose time was ahead, it replies now minus that time, a negative
-- integer: the decision depends only on how far ahead the time was, and
-- the client stamps it with Redis's clock as its recent replies showed it.
-- Otherwise (several keys, any ahead or blocked, or one key blocked) it
-- replies an array of integers: now, then each request's time before it
-- (0 where it was not ahead of now, minus the end of the block for a key
-- blocked until then, which nothing changes). The client repeats the
-- arithmetic (tollgate_core::state::decide_tat) to build each decision.
-- A refund that the fence drops, or a settlement that another
-- configuration drops (a settlement is sent alone), changes nothing and
-- replies {now, time, 0}: three items, the time as above.
-- Every number stays below 2^53, which Lua doubles hold exactly.
--
-- Written for Redis's CPU, which every decision of every app server
-- shares. Per call: TIME. Per request, reading first: a GET; then an
-- admitted request is written with one SET, and a denial writes nothing
-- (a refund that would change a time also reads its fence key).
-- Writing first: SET ... NX GET writes an absent key and reads a present
-- one in one command, which saves an idle key the GET but costs a busy key
-- or a denial the value formatted in vain and a dearer command; the store
-- asks for it while few recent requests found their key busy. The script
-- formats only what it writes (string.format is Lua's cheapest way; a
-- number passed to redis.call is formatted by Redis with %.17g, which
-- costs more), and replies integers: a table costs Redis more than an
-- integer (it probes it for seven special fields before reading it as an
-- array), but far less than formatting each of its numbers in Lua.

local call, try = redis.call, redis.pcall
-- Locals: a global costs a table lookup per use, a library's function two.
local KEYS, ARGV, type = KEYS, ARGV, type
local sub, byte, find, format = string.sub, string.byte, string.find, string.format
local ceil = math.ceil
-- The requests: a settlement, sent alone, also passes its fence key.
local n = state_keys
-- The most a time may be ahead of now, 2^50 µs, as tollgate-core's
-- MAX_SPAN_US; only a settlement's charge can reach it.
local MAX_SPAN = 1125899906842624
local real = ARGV[n + 1] == nil
local now, min_ttl
if real then
  local t = call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(ARGV[n + 1])
  min_ttl = tonumber(ARGV[n + 2])
end

-- A write is spelled out where it happens, rather than in a function: a
-- closure over the locals above costs Redis an upvalue for each of them on
-- every call. Time `at` is written under the descriptor, expiring exactly
-- then: at the millisecond rounded up, in the VM rather than by a call.
-- (Under a test clock, whose time does not pass with Redis's, the TTL is
-- relative and at least min_ttl.)

-- Each request's time before it, for the reply's array; created only when
-- a key's time is ahead of now or a key is blocked (for one request whose
-- time is ahead the reply needs none, only the gap).
local olds, gap
-- The request read last, and its numbers: Lua keeps one copy of equal
-- strings, so a request equal to the one before (the same policy and
-- cost, as most of a batch) is the same string, told in one comparison,
-- and is not read again. The slack is read only when needed.
local last, step, slack, descriptor
-- The time of a refund that the fence dropped, or of a settlement that
-- another configuration dropped, if any.
local held
for i = 1, n do
  local key = KEYS[i]
  local request = ARGV[i]
  if request ~= last then
    last, slack = request, nil
    -- The sign read with the digits: strtoul takes '0' as a digit and a
    -- leading '-' as a negation modulo 2^64, far above any step.
    step = tonumber(sub(request, 1, 15), 16)
    if step >= 9223372036854775808 then step = -tonumber(sub(request, 2, 15), 16) end
    descriptor = sub(request, 30)
  end
  local raw, fresh
  if write_first and step > 0 then
    -- Write now + step if the key is absent, and read it if it is not (an
    -- error reply, not raised, if it is a hash). Not for a refund, which
    -- changes nothing of an absent key.
    local at = now + step
    local value = format('0x%015x|', at) .. descriptor
    if real then
      raw = try('SET', key, value, 'PXAT', format('%d', (at + 999 - (at + 999) % 1000) / 1000), 'NX', 'GET')
    else
      raw = try('SET', key, value, 'PX', math.max(ceil(step / 1000), min_ttl), 'NX', 'GET')
    end
    fresh = not raw
  else
    raw = try('GET', key)
  end
  -- The time (word) the key held, carried over if it was written under
  -- another descriptor.
  -- The time to write, if any.
  local old, carried, blocked, write = nil, false, nil, nil
  if raw then
    -- This version's layout: "0x", 15 digits, the bar at 18, the
    -- descriptor. (An error reply is a table, whose length is 0; an
    -- earlier version's decimal time below 2^53 has at most 16 digits,
    -- so its bar is never at 18.)
    if #raw - 18 == #descriptor and find(raw, descriptor, 19, true) then
      old = tonumber(sub(raw, 1, 17), 16)
    else
      if type(raw) == 'table' then
        -- A hash (the key was kept by the general script), or a failure
        -- to pass on as it is (READONLY, OOM, ...).
        if not find(raw.err, '^WRONGTYPE') then error(raw) end
        raw = nil
      end
      -- An earlier version's layout (the time in decimal), another
      -- descriptor, a block or a hash: carried_word reads them all.
      blocked = block_end(raw)
      if not blocked then
        local word, whole = carried_word(key, raw, descriptor, now)
        if not whole and (step < 0
            or (step > 0 and tonumber(sub(request, 16, 29), 16) == MAX_SPAN)) then
          -- A settlement (a refund, or a charge: its slack is 2^50) of a
          -- key kept under a configuration that does not carry over whole
          -- changes nothing (see lib/carry.lua), and replies as a fenced
          -- refund does, with the word carried over.
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
  elseif old and old > now then
    -- The key's time is ahead: admit from it, or leave it as it is (a
    -- denial writes nothing, unless the time was carried over).
    if n == 1 then
      gap = now - old
    else
      if not olds then
        olds = { now }
        for j = 1, i - 1 do olds[j + 1] = 0 end
      end
      olds[i + 1] = old
    end
    if step ~= 0 and not slack then slack = tonumber(sub(request, 16, 29), 16) end
    if step < 0 and fenced and fenced(slack - MAX_SPAN, now) then
      -- A refund of a request reserved before a reset's or a block's
      -- fence: nothing changes.
      held = old
      if carried then write = old end
    elseif step < 0 then
      -- A refund: the backlog shrinks, never below now (as tollgate-core's
      -- rule::refunded; a time before now would be below 0 under a test
      -- clock before 2005), and by no more than the units of the request
      -- reserved at `slack - MAX_SPAN` still in it: they are gone by then
      -- plus capacity x interval, rounded up to whole units (its
      -- rule::still_held); the rest is later requests' backlog.
      local _, interval, cap = string.match(descriptor, '(%d+)/(%d+)/(%d+)')
      interval, cap = tonumber(interval), tonumber(cap)
      local whole = cap * interval
      if whole > MAX_SPAN then whole = MAX_SPAN end
      local gone = slack - MAX_SPAN + whole - now + interval - 1
      local most = 0
      if gone >= interval then
        most = math.floor(gone / interval)
        while most * interval > gone do most = most - 1 end
        while (most + 1) * interval <= gone do most = most + 1 end
      end
      local refund = -step
      if refund > most * interval then refund = most * interval end
      write = old - refund
      if write < now then write = now end
    elseif step ~= 0 and old - now <= slack then
      -- A charge saturates: with a slack of 2^50 it always gets here, and
      -- old + step may reach beyond now + 2^50, so it stops there (never
      -- below old, which is at most the slack ahead). For a request, old +
      -- step is at most now + capacity x interval, within the cap, and the
      -- test never holds: capping here costs an admitted request one
      -- comparison, where marking a charge apart (a flag argument, a
      -- prefix to parse) would cost every request more.
      write = old + step
      if write - now > MAX_SPAN then write = now + MAX_SPAN end
    elseif carried then
      write = old
    end
  else
    -- Expired, or its time has passed: as fresh. Admit and write now +
    -- step, expiring exactly then; a refund changes nothing of an empty
    -- backlog (now + step would be a time past, which under a test clock
    -- before 2005 is below 0).
    if olds then olds[i + 1] = 0 end
    if step > 0 and not fresh then
      write = now + step
    elseif carried then
      call('DEL', key)
    end
  end
  if write then
    local value = format('0x%015x|', write) .. descriptor
    if real then
      call('SET', key, value, 'PXAT', format('%d', (write + 999 - (write + 999) % 1000) / 1000))
    else
      call('SET', key, value, 'PX', math.max(ceil((write - now) / 1000), min_ttl))
    end
  end
end

if held then
  -- A settlement is sent alone.
  if n ~= 1 then error('tollgate: a dropped settlement among other requests') end
  return { now, held, 0 }
end
if olds then
  return olds
end
if gap then
  return gap
end
return now
