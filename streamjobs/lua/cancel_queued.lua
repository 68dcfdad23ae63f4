-- cancel_queued.lua: the assignment-stream half of cancelling a data stream
-- (Producer.cancel_stream). An assignment queued by add_stream and not delivered yet
-- is removed here at once; one that is delivered (owned, or its owner dead) is left
-- to its owner, which the cancel marker (written by the caller, in the data stream's
-- slot) stops.
-- KEYS[1]  assignment stream (LBS)
-- KEYS[2]  active-assignment index (hash: data stream name -> assignment id)
-- KEYS[3]  lease index
-- ARGV[1]  consumer group name
-- ARGV[2]  data stream name
-- ARGV[3]  the field naming a re-queued copy's job (_first_id)
-- Returns {'removed', id, job} if a queued assignment was deleted, {'delivered', id,
-- job} if the indexed assignment is pending with a consumer, {'none', '', ''} if the
-- index has no unfinished assignment for the stream. job is the assignment's
-- _first_id, or its id when it has none (docs/design.md#job-identity).
-- Reads (the index's type, the pending check) come before the first write.
--#include fields
if redis.call('TYPE', KEYS[2])['ok'] ~= 'hash' then
  return {'none', '', ''}
end
local id = redis.call('HGET', KEYS[2], ARGV[2])
if not id then
  return {'none', '', ''}
end
local lbs_type = redis.call('TYPE', KEYS[1])['ok']
local lease_type = redis.call('TYPE', KEYS[3])['ok']
if (lbs_type ~= 'stream' and lbs_type ~= 'none') or (lease_type ~= 'zset' and lease_type ~= 'none') then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' or ' .. KEYS[3] .. ' holds another type')
end
local job = id
if lbs_type == 'stream' then
  job = entry_field(KEYS[1], id, ARGV[3]) or id
end
local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], id, id, 1)
if p['err'] == nil and #p > 0 then  -- (no group yet: nothing was delivered)
  return {'delivered', id, job}
end
redis.call('XDEL', KEYS[1], id)
redis.call('HDEL', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], id)
return {'removed', id, job}
