-- group_reclaim.lua: one reclaim pass of a shared group on one stream
-- (docs/shared-groups.md#reclaim-only-from-the-dead). Every key is in the stream's slot.
-- KEYS[1]  the data stream
-- KEYS[2]  the stream's member index of this group
-- ARGV[1]  consumer group name
-- ARGV[2]  the reclaiming member (must be alive)
-- ARGV[3]  the most entries to claim
-- ARGV[4]  min idle (ms) of entries pending under names that have no session in the
--          index (other clients of the group); 0: leave those alone
-- ARGV[5]  how long (ms) a dead or stopped member with nothing pending is kept in the
--          index (so status can show it), before it and its group consumer are removed
-- Returns {-1} if the reclaimer is dead (nothing written), {-2} if the stream or its
-- group is gone, else {1, claimed, deliveries, gone, removed}: the claimed ids, their
-- delivery counts before this claim (in the same order), the number of pending
-- entries that no longer exist in the stream (dropped from the pending list by the
-- claim), and the number of members removed.
--
-- A member is dead once its deadline has passed, and stays dead (group_beat.lua never
-- revives it), so its entries can be claimed at once: a slow but live member keeps
-- its own. The claim is JUSTID (it does not count as a delivery); the claimer's read
-- of its own pending entries does. Every read is done before the first write.
--#include time
local now = now_ms()
local me = redis.call('ZSCORE', KEYS[2], ARGV[2])
if not me or tonumber(me) <= now then
  return {-1}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {-2}
end
local summary = redis.pcall('XPENDING', KEYS[1], ARGV[1])
if type(summary) ~= 'table' or summary.err then
  return {-2}
end
local budget = tonumber(ARGV[3])
local min_idle = tonumber(ARGV[4])
local forget = tonumber(ARGV[5])
local holders = {}
for _, c in ipairs(summary[4] or {}) do
  holders[c[1]] = tonumber(c[2])
end
local ids, counts = {}, {}
local function take(consumer, idle)
  if budget <= 0 then
    return
  end
  local found = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', idle, '-', '+', budget, consumer)
  for _, p in ipairs(found) do
    ids[#ids + 1] = p[1]
    counts[#counts + 1] = p[4]
  end
  budget = budget - #found
end
local forgotten = {}
-- Dead and stopped members (scores up to now), oldest deadline first.
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'WITHSCORES', 'LIMIT', 0, 100)
for i = 1, #dead, 2 do
  local name, score = dead[i], tonumber(dead[i + 1])
  if (holders[name] or 0) > 0 then
    take(name, 0)
  else
    local since = score < 0 and -score or score
    if since <= now - forget then
      forgotten[#forgotten + 1] = name
    end
  end
end
if min_idle > 0 then
  for name, n in pairs(holders) do
    if n > 0 and not redis.call('ZSCORE', KEYS[2], name) then
      take(name, min_idle)
    end
  end
end
local claimed, deliveries, gone = {}, {}, 0
if #ids > 0 then
  local args = {'XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0}
  for i = 1, #ids do
    args[#args + 1] = ids[i]
  end
  args[#args + 1] = 'JUSTID'
  local back = redis.call(unpack(args))
  local kept = {}
  for _, id in ipairs(back) do
    kept[id] = true
  end
  for i = 1, #ids do
    if kept[ids[i]] then
      claimed[#claimed + 1] = ids[i]
      deliveries[#deliveries + 1] = counts[i]
    end
  end
  gone = #ids - #claimed
end
for _, name in ipairs(forgotten) do
  redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
  redis.call('ZREM', KEYS[2], name)
end
return {1, claimed, deliveries, gone, #forgotten}
