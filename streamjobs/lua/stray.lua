-- stray.lua: entries delivered to a consumer whose fence failed. The XREADGROUP of a
-- fenced read runs in the same MULTI as fence.lua whatever the fence answers, so a
-- stalled owner (a pause past its lease) that reads once more after it lost its lock
-- still has entries delivered to it. Who takes them, now that it will not:
-- * the lock is held: they stay pending; its owner claims them, in order, before
--   reading further (fence.lua), or its seal acks them (they came after its end);
-- * the lock is free and no job of the name has ended: they stay pending; the next
--   owner of the re-queued assignment claims them;
-- * the lock is free and a job of the name has ended (its ended-job marker, which the
--   next job's start deletes): they were appended after that end and belong to it;
--   they are acked, as the seal acks what a contender read past the end marker
--   (docs/design.md#job-identity). Without this they would stay pending for good.
-- KEYS[1]  lock key of the data stream (same slot as KEYS[2])
-- KEYS[2]  data stream
-- KEYS[3]  the stream's ended-job marker for this service (same slot)
-- ARGV[1]  consumer group name
-- ARGV[2..] the ids the read delivered
-- Returns the number of entries acked.
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[3]) == 0 then
  return 0
end
if redis.call('TYPE', KEYS[2])['ok'] ~= 'stream' then
  return 0
end
return redis.call('XACK', KEYS[2], ARGV[1], unpack(ARGV, 2))
