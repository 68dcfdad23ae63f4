-- seal.lua: the data-stream half of completing a stream, done FIRST (fenced).
-- Acks the last handled entries and the end marker, and sets the retention TTL,
-- while the lock is still held. Completing the assignment (finish.lua) and
-- unlocking (release.lua) follow; if the owner dies between them, the next owner
-- of the re-queued assignment finds the end marker handled and only completes it,
-- and the stream already has its final acks and its retention.
-- KEYS[1]  lock key of the data stream (same slot as KEYS[2])
-- KEYS[2]  data stream
-- ARGV[1]  lock token
-- ARGV[2]  consumer group name
-- ARGV[3]  retention, milliseconds: >0 PEXPIRE; 0 or -1 leave the TTL alone (a
--          stream to delete is deleted by the release, once the assignment is done)
-- ARGV[4..] entry ids to acknowledge
-- Returns 1 if sealed, 0 if the token did not match (nothing done).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if #ARGV > 3 then
  redis.call('XACK', KEYS[2], ARGV[2], unpack(ARGV, 4))
end
local keep = tonumber(ARGV[3])
if keep > 0 then
  redis.call('PEXPIRE', KEYS[2], keep)
end
return 1
