-- release.lua: fenced final ack, lock release and retention of a data stream.
-- KEYS[1]  lock key of the data stream (same slot as KEYS[2])
-- KEYS[2]  data stream
-- ARGV[1]  lock token
-- ARGV[2]  consumer group name
-- ARGV[3]  retention of the data stream, milliseconds: -1 keep as is, 0 delete, >0 PEXPIRE
-- ARGV[4]  'ended' after the seal of a finished job: every entry still pending in the
--          group is acked too (a contender read past the end marker); '' otherwise (a
--          hand-back: what is pending is the next owner's)
-- ARGV[5..] entry ids to acknowledge before releasing
-- Returns 1 if released, 0 if the token did not match (nothing done).
--#include pending
--#include fields
--#include complete
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local drain = ARGV[4] == 'ended' and group_exists(KEYS[2], ARGV[2])
release_writes(KEYS[1], KEYS[2], ARGV[2], tonumber(ARGV[3]), {unpack(ARGV, 5)}, drain)
return 1
