-- group_ack.lua: acknowledge entries of a shared group, fenced by the acker's session
-- (docs/shared-groups.md#fencing). Every key is in the stream's slot.
-- KEYS[1]  the data stream
-- KEYS[2]  the stream's member index of this group
-- KEYS[3]  the stream's restart counters of this group (hash: entry id -> starts)
-- ARGV[1]  consumer group name
-- ARGV[2]  the acking member
-- ARGV[3..] entry ids
-- Returns the number acknowledged, or -1 if the member is dead (nothing acknowledged:
-- its entries are, or will be, another member's).
--#include time
local now = now_ms()
local score = redis.call('ZSCORE', KEYS[2], ARGV[2])
if not score or tonumber(score) <= now then
  return -1
end
if #ARGV < 3 then
  return 0
end
-- Read before the first write: a script is not rolled back.
local counters = redis.call('TYPE', KEYS[3])['ok']
if counters ~= 'hash' and counters ~= 'none' then
  return redis.error_reply('WRONGTYPE the restart counters ' .. KEYS[3] .. ' hold a ' ..
    counters .. ', not a hash')
end
local acked = redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 3))
if counters == 'hash' then
  redis.call('HDEL', KEYS[3], unpack(ARGV, 3))
end
return acked
