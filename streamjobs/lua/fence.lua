-- fence.lua: the fenced half of a data-stream read; the read itself is the XREADGROUP
-- queued after this script in the same MULTI/EXEC (so entries never pass through Lua,
-- and no script call carries data: docs/operations.md#size-and-time-limits).
-- KEYS[1]  lock key of the data stream (same slot as KEYS[2])
-- KEYS[2]  data stream
-- KEYS[3]  cancel marker of the data stream (same slot)
-- ARGV[1]  lock token
-- ARGV[2]  consumer group name
-- ARGV[3..] entry ids to acknowledge first
-- Returns {0} if the token does not match (nothing acked), else
--   {1, last_delivered_id, pending, cancelled}: the group's last-delivered id (the
--   newest id a read that returns nothing has seen, for an XREAD BLOCK that changes
--   no group state), the number of entries still pending in the group after the
--   acks, and the cancel reason if the stream was cancelled (false otherwise; the
--   caller then discards the read and ends the stream).
-- pending > 0 means entries were delivered and not acked: a previous owner's (a
-- takeover), ours from a reply that was lost, or a stalled owner's read queued
-- behind its own failed fence. They come before new ones: the caller discards what
-- the XREADGROUP of this transaction returned and claims the pending ones in order.
--#include fence
local owned, cancelled = fence(KEYS[1], ARGV[1], KEYS[2], ARGV[2], KEYS[3], 3)
if not owned then
  return {0}
end
local pending = redis.call('XPENDING', KEYS[2], ARGV[2])[1]
local last = '0-0'
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[2])) do
  local name, id
  for i = 1, #g, 2 do
    if g[i] == 'name' then
      name = g[i + 1]
    elseif g[i] == 'last-delivered-id' then
      id = g[i + 1]
    end
  end
  if name == ARGV[2] then
    last = id
    break
  end
end
return {1, last, pending, cancelled}
