-- finish.lua: complete an assignment: ack and delete it, forget its lease and its entry
-- in the active-assignment index.
-- Runs BEFORE the lock is released: between the two, a recoverer sees either no
-- pending entry or a live lock, never "pending without a lock".
-- KEYS[1]  assignment stream (LBS)
-- KEYS[2]  lease index (sorted set, same slot)
-- KEYS[3]  active-assignment index (hash: data stream name -> assignment id, same slot)
-- ARGV[1]  consumer group name
-- ARGV[2]  assignment entry id (also its lease member)
-- ARGV[3]  name of the field holding the data stream's name
-- Returns 1 if this call completed it, 0 if it was no longer pending (re-queued by a
-- recoverer: the caller lost the stream).
-- The index entry of the stream goes only if it points at this assignment (another
-- assignment of the same stream, written by other means, never moves it). An index
-- that is not a hash is left alone (add.lua reports it). Every read comes first.
local name = nil
local found = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if #found > 0 then
  local src = found[1][2]
  for i = 1, #src, 2 do
    if src[i] == ARGV[3] then
      name = src[i + 1]
    end
  end
end
local indexed = name ~= nil and redis.call('TYPE', KEYS[3])['ok'] == 'hash' and
  redis.call('HGET', KEYS[3], name) == ARGV[2]
local acked = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[2])
if acked == 1 then
  redis.call('XDEL', KEYS[1], ARGV[2])
  if indexed then
    redis.call('HDEL', KEYS[3], name)
  end
end
return acked
