-- prune_consumers.lua: forget consumer names of the assignment group that are gone.
-- Every process start adds a name (host-pid-random); without this the group grows
-- forever. Deleting a consumer drops its pending entries, so the check and the
-- delete are one script: nothing can be delivered to a name between the two.
-- KEYS[1]  assignment stream (LBS)
-- ARGV[1]  consumer group name
-- ARGV[2]  minimum idle time, milliseconds (a live consumer reads far more often)
-- ARGV[3]  the calling consumer's own name (never pruned)
-- ARGV[4]  start of the service's session keys (same slot): a name whose session key
--          exists belongs to a live consumer and is kept
-- Returns the names deleted: those with no pending entry, idle at least ARGV[2], and
-- no live session.
local min_idle = tonumber(ARGV[2])
local deleted = {}
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local info = {}
  for i = 1, #c, 2 do
    info[c[i]] = c[i + 1]
  end
  if info['name'] ~= ARGV[3] and tonumber(info['pending']) == 0
      and tonumber(info['idle']) >= min_idle
      and redis.call('EXISTS', ARGV[4] .. info['name']) == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    deleted[#deleted + 1] = info['name']
  end
end
return deleted
