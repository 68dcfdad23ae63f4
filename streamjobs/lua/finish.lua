-- finish.lua: complete an assignment: ack and delete it, forget its lease.
-- Runs BEFORE the lock is released: between the two, a recoverer sees either no
-- pending entry or a live lock, never "pending without a lock".
-- KEYS[1]  assignment stream (LBS)
-- KEYS[2]  lease index (sorted set, same slot)
-- ARGV[1]  consumer group name
-- ARGV[2]  assignment entry id (also its lease member)
-- Returns 1 if this call completed it, 0 if it was no longer pending (re-queued by a
-- recoverer: the caller lost the stream).
local acked = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[2])
if acked == 1 then
  redis.call('XDEL', KEYS[1], ARGV[2])
end
return acked
