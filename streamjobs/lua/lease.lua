-- lease.lua: record the server-time deadline of locks this consumer just extended.
-- The lease index lets recoverers find expired locks without waiting for Redis to
-- expire them (expiry events can lag by minutes on a node with many TTL keys).
-- KEYS[1]  lease index (sorted set)
-- KEYS[2]  assignment stream (same slot)
-- ARGV[1]  'add' (a new acquisition: only assignments still pending, so an owner
--          that stalled between its lock and this call does not add a member for an
--          assignment recovered and finished meanwhile, which nothing would remove
--          before its deadline) or 'update' (a heartbeat: only members still
--          present; a stream that finished since the heartbeat's extend has had its
--          member removed by finish.lua, and must not get it back)
-- ARGV[2]  lock TTL, milliseconds
-- ARGV[3]  the assignment stream's consumer group
-- ARGV[4..] lease members (assignment ids)
-- Returns the server time, milliseconds.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[2])
for i = 4, #ARGV do
  if ARGV[1] == 'add' then
    local p = redis.pcall('XPENDING', KEYS[2], ARGV[3], ARGV[i], ARGV[i], 1)
    if type(p) == 'table' and p['err'] == nil and #p > 0 then
      redis.call('ZADD', KEYS[1], deadline, ARGV[i])
    end
  else
    redis.call('ZADD', KEYS[1], 'XX', deadline, ARGV[i])
  end
end
return now
