-- lease.lua: record the server-time deadline of locks this consumer just extended.
-- The lease index lets recoverers find expired locks without waiting for Redis to
-- expire them (expiry events can lag by minutes on a node with many TTL keys).
-- KEYS[1]  lease index (sorted set)
-- ARGV[1]  lock TTL, milliseconds
-- ARGV[2..] lease members
-- Returns the server time, milliseconds.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], deadline, ARGV[i])
end
return now
