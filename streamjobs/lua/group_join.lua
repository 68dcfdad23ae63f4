-- group_join.lua: a GroupConsumer's session on one stream begins
-- (docs/shared-groups.md#sessions). Every key is in the stream's slot.
-- KEYS[1]  the data stream
-- KEYS[2]  the stream's member index of this group (sorted set: member -> deadline)
-- ARGV[1]  consumer group name
-- ARGV[2]  the new member: the consumer's name and a fresh incarnation
-- ARGV[3]  session TTL, milliseconds
-- ARGV[4]  where a group created now starts: '0' (every entry) or '$' (new ones only)
-- Returns the server time (ms). Fails with 'WRONGTYPE ...', writing nothing, if the
-- stream key holds another type.
--
-- A member's score is the server time (ms) until which it is alive; a member whose
-- score is past is dead for good (group_beat.lua never revives it), and a negative
-- score -t means it stopped at t. Everything that can fail is read first.
--#include time
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'stream' and kind ~= 'none' then
  return redis.error_reply('WRONGTYPE the data stream ' .. KEYS[1] .. ' holds a ' ..
    kind .. ', not a stream')
end
local index = redis.call('TYPE', KEYS[2])['ok']
if index ~= 'zset' and index ~= 'none' then
  return redis.error_reply('WRONGTYPE the member index ' .. KEYS[2] .. ' holds a ' ..
    index .. ', not a sorted set')
end
local now = now_ms()
local made = redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], ARGV[4], 'MKSTREAM')
if type(made) == 'table' and made.err and not string.find(made.err, 'BUSYGROUP', 1, true) then
  return redis.error_reply(made.err)
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[2])
return now
