-- dead_letter_entry.lua: append a dead-letter entry for a data-stream entry.
-- The data stream lives in another slot than the DLQ, so this cannot be atomic with
-- the entry's ack: the caller appends here first and acks (fenced) afterwards, so a
-- crash in between leaves a duplicate dead letter, never a lost entry.
-- Its one write is the XADD, so everything that could make it fail is checked first:
-- the key's type, and the size (an entry too large to copy field by field is carried
-- whole in one JSON field: docs/design.md#wire-format).
-- KEYS[1]  dead-letter stream
-- KEYS[2]  the source entry's dead-letter marker (same slot): the id of the dead
--          letter already written for it, kept ARGV[last] ms
-- ARGV[1]  dead-letter MAXLEN (approximate; 0 = unbounded)
-- ARGV[2]  name of the field that receives the server time, milliseconds
-- ARGV[3]  name of the field that carries the original fields as JSON when needed
-- ARGV[4]  the most field names and values one XADD may carry
-- ARGV[5]  m, the number of metadata names and values that follow
-- ARGV[6..5+m]  metadata field/value pairs
-- ARGV[6+m..]   the original entry's field/value pairs (none named like the metadata)
-- ARGV[last] is not part of the pairs: the marker's TTL, milliseconds (the pairs are
--          ARGV[6+m..#ARGV-1])
-- Returns {dlq_entry_id, entries_trimmed}. If the marker exists, the entry was
-- dead-lettered before (and its owner died before acking it): nothing is written and
-- {that id, 0} is returned, so each source entry has one dead letter.
-- Fails with 'WRONGTYPE ...', writing nothing, if KEYS[1] holds something else than a
-- stream.
--#include time
--#include dead_letter
local done = redis.call('GET', KEYS[2])
if done then
  return {done, 0}
end
local marker_ttl = ARGV[#ARGV]
local last = #ARGV - 1
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'stream' and kind ~= 'none' then
  return redis.error_reply('WRONGTYPE the dead-letter stream ' .. KEYS[1] .. ' holds a ' ..
    kind .. ', not a stream')
end
local first = 6 + tonumber(ARGV[5])
local carrier_taken = false
for i = first, last, 2 do
  if ARGV[i] == ARGV[3] then
    carrier_taken = true
  end
end
local out = {}
if carrier_taken or last - 5 + 2 > tonumber(ARGV[4]) then
  local carry = {}
  for i = first, last do
    carry[#carry + 1] = ARGV[i]
  end
  out[1] = ARGV[3]
  out[2] = cjson.encode(carry)
else
  for i = first, last do
    out[#out + 1] = ARGV[i]
  end
end
for i = 6, first - 1 do
  out[#out + 1] = ARGV[i]
end
local dlq_id, trimmed = append_dead_letter(KEYS[1], tonumber(ARGV[1]), out, ARGV[2])
redis.call('SET', KEYS[2], dlq_id, 'PX', marker_ttl)
return {dlq_id, trimmed}
