-- claim.lua: fenced claim of the entries pending in a data stream's group, ids only.
-- The caller fetches their data with XRANGE outside Lua (no script carries data).
-- KEYS[1]  lock key of the data stream (same slot as KEYS[2])
-- KEYS[2]  data stream
-- KEYS[3]  cancel marker of the data stream (same slot)
-- ARGV[1]  lock token
-- ARGV[2]  consumer group name
-- ARGV[3]  consumer name (the claimant)
-- ARGV[4]  most entries to claim
-- ARGV[5..] entry ids to acknowledge first
-- Returns {0} if the token does not match (nothing acked or claimed), else {1, ids}: the
-- oldest pending entries, whoever held them, now pending with the claimant. Pending
-- entries that were deleted from the stream leave the pending list (XAUTOCLAIM does
-- that) and are not returned.
-- {1, {}, reason} if the stream was cancelled: the acks are made, nothing is claimed,
-- and the caller ends the stream (as after fence.lua): a claim is a read too, and a
-- cancelled stream hands nothing more to handle().
--#include fence
local owned, cancelled = fence(KEYS[1], ARGV[1], KEYS[2], ARGV[2], KEYS[3], 5)
if not owned then
  return {0}
end
if cancelled then
  return {1, {}, cancelled}
end
local cursor = '0-0'
for _ = 1, 16 do
  local r = redis.call('XAUTOCLAIM', KEYS[2], ARGV[2], ARGV[3], 0, cursor, 'COUNT', ARGV[4],
    'JUSTID')
  if #r[2] > 0 then
    return {1, r[2]}
  end
  cursor = r[1]
  if cursor == '0-0' then
    break
  end
end
return {1, {}}
