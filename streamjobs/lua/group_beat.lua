-- group_beat.lua: renew a GroupConsumer's session on some streams
-- (docs/shared-groups.md#sessions). All keys in one slot.
-- KEYS[1] .. KEYS[n]  member indexes (sorted sets: member -> deadline, ms)
-- ARGV[1]     session TTL, milliseconds
-- ARGV[2..n+1] the member to renew in each index, in KEYS order
-- Returns one integer per key: 1 renewed, 0 dead (its deadline passed, it stopped, or
-- it is gone): a dead member is never revived, so whatever was reclaimed from it
-- stays with its new holder.
--#include time
local now = now_ms()
-- Every score is read before the first write: a script is not rolled back.
local out = {}
for i = 1, #KEYS do
  local score = redis.call('ZSCORE', KEYS[i], ARGV[i + 1])
  out[i] = (score and tonumber(score) > now) and 1 or 0
end
for i = 1, #KEYS do
  if out[i] == 1 then
    redis.call('ZADD', KEYS[i], 'XX', now + tonumber(ARGV[1]), ARGV[i + 1])
  end
end
return out
