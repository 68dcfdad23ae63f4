-- group_leave.lua: a GroupConsumer stops reading a stream
-- (docs/shared-groups.md#stopping). Every key is in the stream's slot.
-- KEYS[1]  the data stream
-- KEYS[2]  the stream's member index of this group
-- ARGV[1]  consumer group name
-- ARGV[2]  the member
-- The member is marked stopped (score -now): from then on it acknowledges nothing, and
-- whatever is still pending under it is reclaimed by the next pass of any live member.
-- With nothing pending, it also leaves the group itself.
-- Returns the number of entries left pending under it.
--#include time
local now = now_ms()
local pending = 0
local grouped = false
if redis.call('EXISTS', KEYS[1]) == 1 then
  local summary = redis.pcall('XPENDING', KEYS[1], ARGV[1])
  if type(summary) == 'table' and not summary.err then
    grouped = true
    for _, c in ipairs(summary[4] or {}) do
      if c[1] == ARGV[2] then
        pending = tonumber(c[2])
      end
    end
  end
end
local known = redis.call('ZSCORE', KEYS[2], ARGV[2])
-- Every read is done: the writes follow (a script is not rolled back).
if grouped and pending == 0 then
  redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
end
if known then
  redis.call('ZADD', KEYS[2], -now, ARGV[2])
end
return pending
