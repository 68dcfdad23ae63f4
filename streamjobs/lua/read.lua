-- read.lua: fenced ack + fenced read of a data stream, in one round trip.
-- KEYS[1]  lock key of the data stream (same slot as KEYS[2])
-- KEYS[2]  data stream
-- ARGV[1]  lock token
-- ARGV[2]  consumer group name
-- ARGV[3]  consumer name
-- ARGV[4]  entries to read (0: ack only)
-- ARGV[5..] entry ids to acknowledge first
-- Returns {0} if the token does not match (nothing acked, nothing read), else
--   {1, top_id, entries}; top_id is the newest id in the stream when nothing was read,
--   for an XREAD BLOCK that changes no group state.
--
-- Pending entries of the stream come first, whoever holds them: the previous owner's
-- (a takeover; the lock proves that owner is gone) or our own from a call whose reply
-- was lost (a client retry must not skip a batch). The caller acks everything it has
-- handled in the same call, so what is still pending here is unhandled.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0}
end
if #ARGV > 4 then
  redis.call('XACK', KEYS[2], ARGV[2], unpack(ARGV, 5))
end
local count = tonumber(ARGV[4])
if count == 0 then
  return {1, '0-0', {}}
end
local cursor = '0-0'
for _ = 1, 16 do
  local r = redis.call('XAUTOCLAIM', KEYS[2], ARGV[2], ARGV[3], 0, cursor, 'COUNT', count)
  if #r[2] > 0 then
    return {1, '0-0', r[2]}
  end
  cursor = r[1]
  if cursor == '0-0' then
    break
  end
end
local r = redis.call('XREADGROUP', 'GROUP', ARGV[2], ARGV[3], 'COUNT', count, 'STREAMS', KEYS[2], '>')
if r then
  return {1, '0-0', r[1][2]}
end
local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if #top > 0 then
  return {1, top[1][1], {}}
end
return {1, '0-0', {}}
