-- replay_entry.lua: append a dead data entry back onto its data stream, once.
-- The replay marker (same slot as the stream) remembers for a day which id a dead
-- letter's replay appended, so a repeat (after a crash before the dead letter was
-- removed, or a second operator) appends nothing and answers the same id.
-- KEYS[1]  data stream
-- KEYS[2]  replay marker of this dead letter
-- ARGV[1]  the marker's lifetime, milliseconds
-- ARGV[2]  '1' to append an end marker after the entry (the stream had finished),
--          with ARGV[3] its field name and ARGV[4] its value
-- ARGV[5..] the entry's fields and values
-- Returns {id, appended (1) or already replayed (0)}.
local done = redis.call('GET', KEYS[2])
if done then
  return {done, 0}
end
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' and t ~= 'stream' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is not a stream')
end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 5))
if ARGV[2] == '1' then
  redis.call('XADD', KEYS[1], '*', ARGV[3], ARGV[4])
end
redis.call('PERSIST', KEYS[1])
redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
return {id, 1}
