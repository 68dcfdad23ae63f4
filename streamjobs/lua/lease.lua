-- lease.lua: record the server-time deadline of assignments this consumer holds.
-- The lease index lets recoverers find expired locks without waiting for Redis to
-- expire them (expiry events can lag by minutes on a node with many TTL keys).
-- KEYS[1]  lease index (sorted set)
-- KEYS[2]  assignment stream (same slot)
-- ARGV[1]  the mode:
--          'own'    a new acquisition, before its lock is taken: only assignments
--                   still pending with ARGV[4] (with anyone, if '') get a member, and
--                   the reply says which they are. So a consumer stalled between reading an assignment and
--                   this call learns that recovery re-queued it (another consumer may
--                   have run the copy), and adds no member that nothing would remove
--                   before its deadline. One call serves every assignment of an intake
--                   read (docs/design.md#ownership).
--          'update' a heartbeat: only members still present; a stream that finished
--                   since the heartbeat's extend has had its member removed by
--                   finish.lua, and must not get it back.
-- ARGV[2]  TTL, milliseconds: the deadline is server time + this
-- ARGV[3]  the assignment stream's consumer group
-- ARGV[4]  the consumer ('own'; '' otherwise)
-- ARGV[5..] lease members (assignment ids)
-- Returns {server time in ms, then per member 1 if recorded, 0 if not}.
--#include time
local now = now_ms()
local deadline = now + tonumber(ARGV[2])
local out = {now}
for i = 5, #ARGV do
  local done = 0
  if ARGV[1] == 'own' then
    local p
    if ARGV[4] == '' then
      p = redis.pcall('XPENDING', KEYS[2], ARGV[3], ARGV[i], ARGV[i], 1)
    else
      p = redis.pcall('XPENDING', KEYS[2], ARGV[3], ARGV[i], ARGV[i], 1, ARGV[4])
    end
    if type(p) == 'table' and p['err'] == nil and #p > 0 then
      redis.call('ZADD', KEYS[1], deadline, ARGV[i])
      done = 1
    end
  else
    done = redis.call('ZADD', KEYS[1], 'XX', 'CH', deadline, ARGV[i])
  end
  out[#out + 1] = done
end
return out
