-- seal.lua: the data-stream half of completing a stream, done FIRST (fenced).
-- Acks the last handled entries and the end marker, and sets the retention TTL,
-- while the lock is still held. Completing the assignment (finish.lua) and
-- unlocking (release.lua) follow; if the owner dies between them, the next owner
-- of the re-queued assignment finds the end marker handled and only completes it,
-- and the stream already has its final acks and its retention.
-- KEYS[1]  lock key of the data stream (same slot as KEYS[2])
-- KEYS[2]  data stream
-- KEYS[3]  cancel marker of the data stream (same slot)
-- KEYS[4]  the stream's ended-job marker for this service (same slot)
-- ARGV[1]  lock token
-- ARGV[2]  consumer group name
-- ARGV[3]  retention, milliseconds: >0 PEXPIRE; 0 or -1 leave the TTL alone (a
--          stream to delete is deleted by the release, once the assignment is done)
-- ARGV[4]  'cancel' when the stream was cancelled: the group moves past every entry
--          not yet read; '' otherwise. Either way every entry still pending in the
--          group is acked (delivered, never to be handled: after a cancel, or read past
--          the end marker by a contender whose acquisition failed). The cancel marker goes either way: a
--          cancel that came after the stream's own end marker was read is moot.
-- The ended-job marker is set either way, for ARGV[6] ms: 'e <job>' after a cancel
-- or an early finish ('cancel'), 'n <job>' after the end marker. What is appended to
-- the stream from now on belongs to this ended job, and the next job of the name
-- skips it (docs/design.md#job-identity).
-- ARGV[5]  the job (its first assignment id); '' writes no marker
-- ARGV[6]  the ended-job marker's lifetime, milliseconds
-- ARGV[7]  the lock's TTL is set to this many milliseconds (0: left alone): the
--          lock-mode TTL, which cuts a session-mode lock's long one.
--          The assignment goes next, then the lock: an owner that dies between the
--          two leaves a lock that expires within this, not the long session-mode TTL
--          (docs/design.md#sessions).
-- ARGV[8..] entry ids to acknowledge
-- Returns 1 if sealed, 0 if the token did not match (nothing done).
--#include pending
--#include fields
--#include complete
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local cancel = ARGV[4] == 'cancel'
local has_group = seal_reads(KEYS[2], ARGV[2], cancel)
seal_writes(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], tonumber(ARGV[3]), cancel,
  has_group, ARGV[5], ARGV[6], tonumber(ARGV[7]), {unpack(ARGV, 8)})
return 1
