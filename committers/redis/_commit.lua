-- One Redis commit of committers.redis.RedisCommitter: check, then write, atomically.
--
-- Redis runs a script alone (no other command interleaves), but does not roll it back
-- when a command fails half-way: writes made before the failure stay. So the script runs
-- in two passes. The first only reads: the fence, the mode, the txid, key types, the
-- value type recorded for each hash, and every new value, computed exactly and checked
-- (a LONG overflow, a non-finite double, a decimal needing more digits than declared, a
-- stored value that is not of the hash's type). Only when all pass does the second pass
-- write: undo (opaque replay), apply, record. Nothing in the second pass can fail on data.
--
-- A hash keeps a sum (counts are sums too), a minimum, a maximum or a last value per
-- field (``batch.counters[i].agg``): ``add`` below. Values, per hash type
-- (``batch.counters[i].kind``), for sums:
--
-- - ``long``: the new value is computed, checked and written as plain digits, the text
--   ``HINCRBY`` would leave: in doubles when both numbers are below 2^52 in magnitude
--   (exact: their sum is below 2^53), else exactly, in decimal digit strings (so a
--   group's increment beyond 64 bits whose sum with the stored value fits is stored).
-- - ``double``: the sum of the stored double and the increment, one IEEE 754 addition in
--   Lua (whose numbers are C doubles), stored with ``HSET`` as the shortest of ``%.15g``,
--   ``%.16g``, ``%.17g`` that reads back as the same double. Not ``HINCRBYFLOAT``: it adds
--   in long double and prints 17 digits after the point, so it rounds differently from a
--   double sum and turns an increment below 1e-17 into nothing.
-- - ``decimal``: exact addition of decimal digit strings with the hash's scale, stored
--   with ``HSET`` as plain text with exactly ``scale`` digits after the point.
--
-- Keys: 1 txid, 2 undo log, 3 undo dead-letter count, 4 mode, 5 dead-letter list,
-- 6 fence, 7 value types (hash name -> declared type), 8.. the counter hashes, then the
-- staging lists, then (overlapping commits) the sorted set of txids held ahead. A
-- counter's fields and increments come in the argument (``c.f``, a flat list) or, for
-- a large commit, in a staging list the committer filled before with
-- bounded, pipelined JSON chunks of that flat list (``c.st``: its key; read here,
-- deleted by the committer). Fields are read with one ``HMGET`` and written with one
-- ``HSET`` per ``CHUNK`` of them: a ``redis.call`` costs more than the command it runs
-- on one field. The fence
-- is checked first and raised by every commit that passes, a skipped one included:
-- once a new leader has committed anything here, no commit of an earlier leader gets
-- through.
-- A commit group (txids ``first``..``txid``, one write marked with ``txid``): the runner
-- records it before this script first runs for it and commits exactly it again until
-- it is through, so the namespace holds either ``txid`` (all of it) or a txid below
-- ``first``. A txid in between is refused ('split'); in opaque mode a held txid at or
-- above ``first`` can only come from a write of this group (``first`` is the store's
-- currtx), so that write is undone before this one applies.
local match, format, abs = string.match, string.format, math.abs
local batch = cjson.decode(ARGV[1])
local txid = tonumber(batch.txid)
local first = tonumber(batch.first or batch.txid)
local opaque = batch.mode == 'opaque'
local fence = tonumber(batch.fence)
if fence then
  local held = tonumber(redis.call('GET', KEYS[6]) or '0')
  if fence < held then
    return {'fenced', tostring(held)}
  end
end
local stored_mode = redis.call('GET', KEYS[4])
if stored_mode and stored_mode ~= batch.mode then
  return {'mode', stored_mode}
end
local last = redis.call('GET', KEYS[1])
local last_n = last and tonumber(last)
-- at_least_once and at_most_once (``batch.unchecked``, transactional mode only): no
-- last-txid check; a txid held is applied again, and the marker never moves back.
local unchecked = batch.unchecked and not opaque
local held_n = last_n
if unchecked then
  if last_n and last_n > txid then batch.txid = last end
  last_n = nil
end
if last_n and txid <= last_n and not opaque then
  if fence then redis.call('SET', KEYS[6], batch.fence) end
  -- A write, so that the committer's WAIT after this script (``batch.sync``) waits for
  -- replicas to hold everything up to here, the skipped txid's own write included.
  if batch.sync then redis.call('SET', KEYS[1], last) end
  return {'skipped', last}
end
if last_n and txid < last_n then
  return {'behind', last}
end
if last_n and first <= last_n and last_n < txid then
  return {'split', last}
end
for i = 5, 7 + #batch.counters do
  if i > 6 or (i == 5 and batch.dl) then
    local want = 'hash'
    if i == 5 then want = 'list' end
    local kind = redis.call('TYPE', KEYS[i])['ok']
    if kind ~= 'none' and kind ~= want then
      return {'wrongtype', KEYS[i] .. ' is a ' .. kind .. ', not a ' .. want}
    end
  end
end
for _, c in ipairs(batch.counters) do
  local held = redis.call('HGET', KEYS[7], KEYS[c.k])
  if held and held ~= c.type then
    return {'valuetype', cjson.encode({KEYS[c.k], held})}
  end
end

-- Exact decimal arithmetic on digit strings: (sign, magnitude without leading zeros).
local function dec_parse(text, scale)
  local sign, body = 1, text
  if string.sub(body, 1, 1) == '-' then sign, body = -1, string.sub(body, 2) end
  local int, frac = match(body, '^(%d+)%.(%d+)$')
  if not int then int, frac = match(body, '^(%d+)$'), '' end
  if not int or #frac > scale then return nil end
  local mag = string.gsub(int .. frac .. string.rep('0', scale - #frac), '^0+', '')
  if mag == '' then sign = 1 end
  return sign, mag
end
local function mag_cmp(a, b)
  if #a ~= #b then return (#a < #b) and -1 or 1 end
  if a == b then return 0 end
  return (a < b) and -1 or 1
end
local function mag_add(a, b)
  local out, carry, i, j = {}, 0, #a, #b
  while i > 0 or j > 0 or carry > 0 do
    local d = carry
    if i > 0 then d = d + string.byte(a, i) - 48 end
    if j > 0 then d = d + string.byte(b, j) - 48 end
    if d >= 10 then d, carry = d - 10, 1 else carry = 0 end
    out[#out + 1] = d
    i, j = i - 1, j - 1
  end
  return (string.gsub(string.reverse(table.concat(out)), '^0+', ''))
end
local function mag_sub(a, b)
  local out, borrow, i, j = {}, 0, #a, #b
  while i > 0 do
    local d = string.byte(a, i) - 48 - borrow
    if j > 0 then d = d - (string.byte(b, j) - 48) end
    if d < 0 then d, borrow = d + 10, 1 else borrow = 0 end
    out[#out + 1] = d
    i, j = i - 1, j - 1
  end
  return (string.gsub(string.reverse(table.concat(out)), '^0+', ''))
end
local function dec_add(sa, ma, sb, mb)
  if sa == sb then return sa, mag_add(ma, mb) end
  local c = mag_cmp(ma, mb)
  if c == 0 then return 1, '' end
  if c > 0 then return sa, mag_sub(ma, mb) end
  return sb, mag_sub(mb, ma)
end
local function dec_format(sign, mag, scale)
  if #mag <= scale then mag = string.rep('0', scale - #mag + 1) .. mag end
  local text = mag
  if scale > 0 then
    text = string.sub(mag, 1, #mag - scale) .. '.' .. string.sub(mag, #mag - scale + 1)
  end
  if sign < 0 then text = '-' .. text end
  return text
end
local function fits_long(sign, mag)
  if #mag ~= 19 then return #mag < 19 end
  local bound = '9223372036854775807'
  if sign < 0 then bound = '9223372036854775808' end
  return mag_cmp(mag, bound) <= 0
end
local function finite(x)
  return x ~= nil and x == x and x ~= math.huge and x ~= -math.huge
end

-- -1, 0 or 1 as a is below, equal to or above b, two values of the hash's type (nil:
-- a is not one; b, from the committer, always is).
local function compare(c, a, b)
  local sa, ma, sb, mb
  if c.kind == 'double' then
    local x, y = tonumber(a), tonumber(b)
    if not finite(x) then return nil end
    if x == y then return 0 end
    return (x < y) and -1 or 1
  elseif c.kind == 'long' then
    if a ~= '0' and not match(a, '^%-?[1-9]%d*$') then return nil end
    sa, ma = dec_parse(a, 0)
    sb, mb = dec_parse(b, 0)
  else
    sa, ma = dec_parse(a, c.s)
    if not sa then return nil end
    sb, mb = dec_parse(b, c.s)
  end
  if sa ~= sb then return (sa < sb) and -1 or 1 end
  return sa * mag_cmp(ma, mb)
end

-- The new value of a field from what it holds (``base``, nil: nothing) and the batch's
-- value ``inc``, by the hash's aggregate (``c.agg``): the smaller, the greater, the
-- batch's, or (``sum``) the exact sum. nil and why when it cannot be stored.
local function add(c, base, inc)
  if c.agg == 'last' then return inc end
  if c.agg == 'min' or c.agg == 'max' then
    if not base then return inc end
    local order = compare(c, base, inc)
    if order == nil then return nil, 'stored' end
    if (c.agg == 'min') == (order <= 0) then return base end
    return inc
  end
  if c.kind == 'long' then
    -- The text HINCRBY parses: no sign on zero, no leading zeros, 64 bits.
    if base and base ~= '0' and not match(base, '^%-?[1-9]%d*$') then
      return nil, 'stored'
    end
    local b, i = tonumber(base or '0'), tonumber(inc)
    if abs(b) < 2^52 and abs(i) < 2^52 then
      local v = b + i
      if v == 0 then return '0' end
      return format('%.0f', v)
    end
    local sb, mb = dec_parse(base or '0', 0)
    if not fits_long(sb, mb) then return nil, 'stored' end
    local si, mi = dec_parse(inc, 0)
    local s, m = dec_add(sb, mb, si, mi)
    if not fits_long(s, m) then return nil, 'overflow' end
    return dec_format(s, m, 0)
  elseif c.kind == 'double' then
    local b = 0
    if base then b = tonumber(base) end
    if not finite(b) then return nil, 'stored' end
    local v = b + tonumber(inc)
    if not finite(v) then return nil, 'overflow' end
    if v == 0 then return '0' end
    for _, fmt in ipairs({'%.15g', '%.16g', '%.17g'}) do
      local text = format(fmt, v)
      if tonumber(text) == v then return text end
    end
    return format('%.17g', v)
  end
  local sb, mb = 1, ''
  if base then
    sb, mb = dec_parse(base, c.s)
    if not sb then return nil, 'stored' end
  end
  local si, mi = dec_parse(inc, c.s)
  local s, m = dec_add(sb, mb, si, mi)
  if #m > c.p then return nil, 'overflow' end
  return dec_format(s, m, c.s)
end

local replay = opaque and last_n and last_n >= first
local n = 0
local entries, undo = {}, {}
if replay then
  n = tonumber(redis.call('GET', KEYS[3]) or '0')
  if n > 0 then
    local tail = redis.call('LRANGE', KEYS[5], -n, -1)
    if #tail ~= n then return {'foreign', KEYS[5]} end
    for _, item in ipairs(tail) do
      local ok, d = pcall(cjson.decode, item)
      local dt = ok and type(d) == 'table' and tonumber(d.txid)
      if not dt or dt < first or dt > txid then
        return {'foreign', KEYS[5]}
      end
    end
  end
  entries = redis.call('HGETALL', KEYS[2])
  for i = 1, #entries, 2 do undo[entries[i]] = entries[i + 1] end
end

-- Pass 1: every new value, from what the field holds once this txid's earlier attempt
-- is undone. No write before all are known to fit. ``before`` keeps that value (or
-- ``absent``) per field: the undo log of this attempt.
local CHUNK = 500
local bad, new, before = {}, {}, {}
local given = {}
for ci, c in ipairs(batch.counters) do
  if c.st then
    local fs, m = {}, 0
    for _, part in ipairs(redis.call('LRANGE', KEYS[c.st], 0, -1)) do
      for _, x in ipairs(cjson.decode(part)) do
        m = m + 1
        fs[m] = x
      end
    end
    given[ci] = fs
  else
    given[ci] = c.f
  end
end
for ci, c in ipairs(batch.counters) do
  local h, fs, out, was = KEYS[c.k], given[ci], {}, {}
  local count = #fs / 2
  for s = 1, count, CHUNK do
    local e = math.min(s + CHUNK - 1, count)
    local names = {}
    for j = s, e do names[j - s + 1] = fs[2 * j - 1] end
    local held = redis.call('HMGET', h, unpack(names))
    for j = s, e do
      local f, inc = fs[2 * j - 1], fs[2 * j]
      local base = nil
      if replay then base = undo[h .. '\0' .. f] end
      if base == nil then
        base = held[j - s + 1] or nil
      elseif base == batch.absent then
        base = nil
      end
      local value, why = add(c, base, inc)
      if value == nil and #bad < 5 then
        bad[#bad + 1] = {h, f, why, base == nil and cjson.null or base, inc}
      end
      out[j], was[j] = value, base or batch.absent
    end
  end
  new[ci], before[ci] = out, was
end
if #bad > 0 then return {'refused', cjson.encode(bad)} end

-- Pass 2: undo (opaque replay), apply, record.
local status = 'applied'
if replay then
  for i = 1, #entries, 2 do
    local k, prev = entries[i], entries[i + 1]
    local sep = string.find(k, '\0', 1, true)
    local h, f = string.sub(k, 1, sep - 1), string.sub(k, sep + 1)
    if prev == batch.absent then
      redis.call('HDEL', h, f)
    else
      redis.call('HSET', h, f, prev)
    end
  end
  if n > 0 then redis.call('LTRIM', KEYS[5], 0, -n - 1) end
  status = 'reapplied'
end
redis.call('DEL', KEYS[2])
for ci, c in ipairs(batch.counters) do
  local h, fs, out, was = KEYS[c.k], given[ci], new[ci], before[ci]
  local count = #fs / 2
  for s = 1, count, CHUNK do
    local e = math.min(s + CHUNK - 1, count)
    local values, saved, m = {}, {}, 0
    for j = s, e do
      values[m + 1], values[m + 2] = fs[2 * j - 1], out[j]
      if opaque then saved[m + 1], saved[m + 2] = h .. '\0' .. fs[2 * j - 1], was[j] end
      m = m + 2
    end
    redis.call('HSET', h, unpack(values))
    if opaque then redis.call('HSET', KEYS[2], unpack(saved)) end
  end
  redis.call('HSET', KEYS[7], h, c.type)
end
local pushed = #batch.dead
for i = 1, pushed, 1000 do
  redis.call('RPUSH', KEYS[5], unpack(batch.dead, i, math.min(i + 999, pushed)))
end
if opaque then redis.call('SET', KEYS[3], pushed) end
if unchecked and batch.ahead then
  -- Overlapping commits (at_least_once, ``batch.ahead``: the key of a sorted set): the
  -- marker ends the unbroken run of txids held from the first, so that a txid at or
  -- below it is held whatever order the commits landed in. A commit that lands before
  -- one below it waits in the set until the run reaches it. Every txid below
  -- ``batch.settled`` is held (the runner's store moved past them).
  local ahead = KEYS[batch.ahead]
  local run = math.max(held_n or 0, tonumber(batch.settled) - 1)
  if first > run + 1 then
    for t = first, txid do redis.call('ZADD', ahead, t, t) end
  else
    run = math.max(run, txid)
    while redis.call('ZSCORE', ahead, run + 1) do run = run + 1 end
    redis.call('ZREMRANGEBYSCORE', ahead, '-inf', run)
  end
  if run > 0 then redis.call('SET', KEYS[1], run) end
else
  redis.call('SET', KEYS[1], batch.txid)
end
redis.call('SET', KEYS[4], batch.mode)
if fence then redis.call('SET', KEYS[6], batch.fence) end
return {status, last or ''}
