-- group_replay.lua: put one dead entry of a shared group back on its stream, for any
-- member of the group to read (docs/shared-groups.md#dead-letters). Every key is in
-- the stream's slot, and every read is done before the first write.
-- KEYS[1]  the data stream
-- KEYS[2]  the dead letter's replay marker
-- ARGV[1]  the marker's lifetime, milliseconds
-- ARGV[2..] the entry's field names and values (with _replayed_from)
-- Returns the id appended, or the one a previous replay of this dead letter appended
-- (its marker): a repeat appends nothing. Fails with 'WRONGTYPE ...', writing nothing,
-- if the stream key holds another type.
local done = redis.call('GET', KEYS[2])
if done then
  return done
end
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'stream' and kind ~= 'none' then
  return redis.error_reply('WRONGTYPE the data stream ' .. KEYS[1] .. ' holds a ' ..
    kind .. ', not a stream')
end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
return id
