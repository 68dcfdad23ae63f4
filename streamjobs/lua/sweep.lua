-- sweep.lua: hand out lease members whose deadline has passed, each to one checker.
-- Claimed members are pushed ARGV[3] ms into the future, so concurrent sweepers do
-- not check the same lock; a live owner's next heartbeat writes its true deadline.
-- KEYS[1]  lease index (sorted set)
-- ARGV[1]  horizon, milliseconds (members due before now + horizon are included)
-- ARGV[2]  maximum members to return
-- ARGV[3]  re-check delay, milliseconds
-- Returns the claimed members and their deadlines before the claim: {id, ms, id, ms, ...}.
--#include time
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now + tonumber(ARGV[1]),
  'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
for i = 1, #due, 2 do
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), due[i])
end
return due
