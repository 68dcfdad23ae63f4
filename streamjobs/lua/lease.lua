-- lease.lua: record the server-time deadline of locks this consumer just extended.
-- The lease index lets recoverers find expired locks without waiting for Redis to
-- expire them (expiry events can lag by minutes on a node with many TTL keys).
-- KEYS[1]  lease index (sorted set)
-- ARGV[1]  'add' (a new acquisition) or 'update' (a heartbeat: only members still
--          present; a stream that finished since the heartbeat's extend has had its
--          member removed by finish.lua, and must not get it back)
-- ARGV[2]  lock TTL, milliseconds
-- ARGV[3..] lease members
-- Returns the server time, milliseconds.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[2])
for i = 3, #ARGV do
  if ARGV[1] == 'add' then
    redis.call('ZADD', KEYS[1], deadline, ARGV[i])
  else
    redis.call('ZADD', KEYS[1], 'XX', deadline, ARGV[i])
  end
end
return now
