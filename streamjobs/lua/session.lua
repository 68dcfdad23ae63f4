-- session.lua: a consumer session under Liveness.SESSION (docs/design.md#liveness).
-- KEYS[1]  session key of the consumer (string, PX)
-- KEYS[2]  session index (sorted set: member -> server-time deadline, ms; same slot)
-- KEYS[3]  the assignment stream (same slot)
-- ARGV[1]  'create' | 'renew' | 'end' | 'forget'
-- ARGV[2]  create/renew/end: the session's value (JSON naming its incarnation);
--          forget: the incarnation
-- ARGV[3]  session TTL, milliseconds
-- ARGV[4]  index member of this incarnation
-- ARGV[5]  end: the service's consumer group on the assignment stream
-- ARGV[6]  end: the consumer's name in that group
-- create: SET the key and index the member; returns 1.
-- renew:  only if the key still holds this value (a session that expired or was
--         replaced never comes back: its locks may already be someone else's);
--         returns 1 if renewed, 0 if not.
-- end:    a clean stop: the key goes. If no assignment is pending with the consumer
--         (everything it held was finished or handed back) the member goes too: there
--         is nothing to recover. Else it falls due now, so a sweeper checks at once for
--         what the stop could not hand back. Returns 1 if the key was ours.
-- forget: drop the member once its incarnation is dead (key gone or replaced) and
--         its assignments were recovered; returns 1 if dropped, 0 if still alive.
-- Every read comes before the first write.
--#include time
local now = now_ms()
local mode = ARGV[1]
if mode == 'create' then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[4])
  return 1
end
local value = redis.call('GET', KEYS[1])
if mode == 'forget' then
  if value and string.find(value, '"' .. ARGV[2] .. '"', 1, true) then
    return 0
  end
  redis.call('ZREM', KEYS[2], ARGV[4])
  return 1
end
if value ~= ARGV[2] then
  return 0
end
if mode == 'renew' then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[4])
  return 1
end
-- end (an error of XPENDING, say a missing group, counts as something pending)
local pending = redis.pcall('XPENDING', KEYS[3], ARGV[5], '-', '+', 1, ARGV[6])
local holds = type(pending) ~= 'table' or pending.err ~= nil or #pending > 0
redis.call('DEL', KEYS[1])
if holds then
  redis.call('ZADD', KEYS[2], now, ARGV[4])
else
  redis.call('ZREM', KEYS[2], ARGV[4])
end
return 1
