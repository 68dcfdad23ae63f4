-- next_due.lua: how long until the earliest deadline in the lease and session indexes.
-- The sweep sleeps until then (capped by its interval) instead of a fixed interval, so
-- a dead owner is recovered as its deadline passes, without waiting for Redis to
-- expire its lock or for the next turn of the sweep (docs/recovery.md).
-- KEYS[1]  lease index (sorted set)
-- KEYS[2]  session index (sorted set, same slot)
-- Returns milliseconds from now (server time) to the earliest deadline, 0 if one has
-- passed, or -1 if both indexes are empty. Read only.
--#include time
local now = now_ms()
local earliest = nil
for i = 1, 2 do
  -- ZRANGEBYSCORE, not ZRANGE: a command the consumer's ACL already allows.
  local first = redis.call('ZRANGEBYSCORE', KEYS[i], '-inf', '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #first > 0 then
    local score = tonumber(first[2])
    if earliest == nil or score < earliest then
      earliest = score
    end
  end
end
if earliest == nil then
  return -1
end
return math.max(0, math.floor(earliest - now))
