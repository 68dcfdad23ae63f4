-- dead_letter_assignment.lua: atomically move a pending assignment to the dead-letter stream.
-- Redis does not roll a script back, so everything that can fail is checked before
-- the first write (ZREM, then XACK): the dead-letter key's type, the entry's read, and
-- the size of the copy. An entry too large to copy field by field is carried whole in
-- one JSON field (docs/design.md#wire-format).
-- KEYS[1]  assignment stream (LBS)
-- KEYS[2]  dead-letter stream (same slot)
-- KEYS[3]  lease index (same slot)
-- KEYS[4]  active-assignment index (hash: data stream name -> assignment id, same slot)
-- ARGV[1]  consumer group name
-- ARGV[2]  assignment entry id (also its lease member)
-- ARGV[3]  dead-letter MAXLEN (approximate; 0 = unbounded)
-- ARGV[4]  name of the field that receives the server time, milliseconds
-- ARGV[5]  name of the field that carries the original fields as JSON when needed
-- ARGV[6]  the most field names and values one XADD may carry
-- ARGV[7]  name of the field holding the data stream's name
-- ARGV[8..] metadata field/value pairs; they replace original fields of the same name
-- Returns {dlq_entry_id, entries_trimmed}, or false if the entry was not pending.
-- Fails with 'WRONGTYPE ...', writing nothing, if KEYS[2] holds something else than a
-- stream.
-- The stream's entry in the active-assignment index goes only if it points at this
-- assignment (another assignment of the same stream, written by other means, never
-- moves it). An index that is not a hash is left alone (add.lua reports it).
--#include time
--#include dead_letter
local kind = redis.call('TYPE', KEYS[2])['ok']
if kind ~= 'stream' and kind ~= 'none' then
  return redis.error_reply('WRONGTYPE the dead-letter stream ' .. KEYS[2] .. ' holds a ' ..
    kind .. ', not a stream')
end
local meta = {[ARGV[4]] = true}
for i = 8, #ARGV, 2 do
  meta[ARGV[i]] = true
end
-- The original fields that the metadata does not replace.
local carry = {}
local carrier_taken = false
local name = nil
local found = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if #found > 0 then
  local src = found[1][2]
  for i = 1, #src, 2 do
    if src[i] == ARGV[7] then
      name = src[i + 1]
    end
    if not meta[src[i]] then
      carry[#carry + 1] = src[i]
      carry[#carry + 1] = src[i + 1]
      carrier_taken = carrier_taken or src[i] == ARGV[5]
    end
  end
end
local out = {}
if carrier_taken or #carry + (#ARGV - 7) + 2 > tonumber(ARGV[6]) then
  out[1] = ARGV[5]
  out[2] = cjson.encode(carry)
else
  out = carry
end
for i = 8, #ARGV do
  out[#out + 1] = ARGV[i]
end
local indexed = name ~= nil and redis.call('TYPE', KEYS[4])['ok'] == 'hash' and
  redis.call('HGET', KEYS[4], name) == ARGV[2]
redis.call('ZREM', KEYS[3], ARGV[2])
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return false
end
local dlq_id, trimmed = append_dead_letter(KEYS[2], tonumber(ARGV[3]), out, ARGV[4])
redis.call('XDEL', KEYS[1], ARGV[2])
if indexed then
  redis.call('HDEL', KEYS[4], name)
end
return {dlq_id, trimmed}
