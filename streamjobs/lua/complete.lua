-- complete.lua: seal.lua, finish.lua and release.lua in one script, for a server that
-- holds every key (ClusterMode.NONE): one round trip instead of three, and no moment
-- between the steps for a crash to fall into (docs/design.md#finishing-and-hand-back).
-- KEYS[1]  lock key of the data stream
-- KEYS[2]  data stream
-- KEYS[3]  cancel marker of the data stream
-- KEYS[4]  the stream's ended-job marker for this service
-- KEYS[5]  assignment stream (LBS)
-- KEYS[6]  lease index
-- KEYS[7]  active-assignment index
-- ARGV[1]  lock token
-- ARGV[2]  the data stream's consumer group name (the service)
-- ARGV[3]  retention, milliseconds: >0 PEXPIRE at the seal, 0 delete at the release,
--          -1 leave the stream alone
-- ARGV[4]  'cancel' or '' (as seal.lua)
-- ARGV[5]  the job (its first assignment id); '' writes no ended-job marker
-- ARGV[6]  the ended-job marker's lifetime, milliseconds
-- ARGV[7]  the assignment stream's consumer group name
-- ARGV[8]  the assignment's id
-- ARGV[9]  name of the assignment field holding the data stream's name
-- ARGV[10..] entry ids to acknowledge
-- Returns {sealed, finished}: {0, 0} if the token did not match (nothing done: the lock
-- is lost); else {1, 1 if this call completed the assignment, 0 if it was no longer
-- pending (a recoverer re-queued it)}. The lock is released whenever it was sealed.
-- Every read comes before the first write.
--#include pending
--#include fields
--#include complete
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0, 0}
end
local cancel = ARGV[4] == 'cancel'
local has_group = seal_reads(KEYS[2], ARGV[2], cancel)
local name, indexed = finish_reads(KEYS[5], KEYS[7], ARGV[8], ARGV[9])
local keep = tonumber(ARGV[3])
seal_writes(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], keep, cancel, has_group,
  ARGV[5], ARGV[6], 0, {unpack(ARGV, 10)})
local finished = finish_writes(KEYS[5], KEYS[6], KEYS[7], ARGV[7], ARGV[8], name, indexed)
release_writes(KEYS[1], KEYS[2], ARGV[2], keep == 0 and 0 or -1, {}, false)
return {1, finished}
