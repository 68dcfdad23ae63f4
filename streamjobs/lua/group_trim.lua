-- group_trim.lua: trim a stream read by consumer groups (docs/shared-groups.md#retention).
-- KEYS[1]  the data stream
-- KEYS[2]  the service's pace key of the stream (Keys.trimmed, same slot): while it
--          exists another consumer of the service trimmed lately, and this pass is
--          skipped
-- ARGV[1]  trim what every group has acknowledged: '1' yes, '0' no
-- ARGV[2]  cap on length (0: none)
-- ARGV[3]  cap on age, milliseconds (0: none)
-- ARGV[4]  the most entries one XTRIM may remove (LIMIT: paces a long backlog)
-- ARGV[5]  the pace key's lifetime, milliseconds
-- Returns {acknowledged, dropped, done}: entries removed below the floor (every group
-- had acknowledged them), entries removed by a cap at or above the floor (some of them
-- may have been acknowledged too: never fewer than the unacknowledged ones dropped),
-- and 1 if the pass ran, 0 if it was skipped. Every read that can fail comes first.
--
-- The floor is the lowest, over every group of the stream, of its oldest pending entry
-- or (nothing pending) its last-delivered id: each entry below it was delivered to
-- every group and is pending in none. Trimming is approximate (~): whole nodes of the
-- stream below the threshold only, never an entry at or above it.
--#include time
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {0, 0, 0}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0, 0, 1}
end
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function less(a, b)
  local am, as = parse(a)
  local bm, bs = parse(b)
  return am < bm or (am == bm and as < bs)
end
local floor = nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, pending, last
  for i = 1, #g, 2 do
    if g[i] == 'name' then
      name = g[i + 1]
    elseif g[i] == 'pending' then
      pending = tonumber(g[i + 1])
    elseif g[i] == 'last-delivered-id' then
      last = g[i + 1]
    end
  end
  local candidate = last
  if pending > 0 then
    candidate = redis.call('XPENDING', KEYS[1], name)[2]
  end
  if floor == nil or less(candidate, floor) then
    floor = candidate
  end
end
if floor == nil then
  return {0, 0, 1}  -- no group: nothing is known to be acknowledged
end
redis.call('SET', KEYS[2], '1', 'PX', tonumber(ARGV[5]))
local limit = tonumber(ARGV[4])
local acknowledged = 0
if ARGV[1] == '1' then
  acknowledged = redis.call('XTRIM', KEYS[1], 'MINID', '~', floor, 'LIMIT', limit)
end
local dropped = 0
local max_age = tonumber(ARGV[3])
if max_age > 0 then
  local now = now_ms()
  local cutoff = string.format('%d-0', now - max_age)
  if less(floor, cutoff) then
    dropped = dropped + redis.call('XTRIM', KEYS[1], 'MINID', '~', cutoff, 'LIMIT', limit)
  end
end
local max_len = tonumber(ARGV[2])
if max_len > 0 and redis.call('XLEN', KEYS[1]) > max_len then
  dropped = dropped + redis.call('XTRIM', KEYS[1], 'MAXLEN', '~', max_len, 'LIMIT', limit)
end
return {acknowledged, dropped, 1}
