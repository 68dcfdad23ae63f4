-- dlq_add.lua: append a dead-letter entry for a data-stream entry.
-- The data stream lives in another slot than the DLQ, so this cannot be atomic with
-- the entry's ack: the caller appends here first and acks (fenced) afterwards, so a
-- crash in between leaves a duplicate dead letter, never a lost entry.
-- KEYS[1]  dead-letter stream
-- ARGV[1]  dead-letter MAXLEN (approximate; 0 = unbounded)
-- ARGV[2]  name of the field that receives the server time, milliseconds
-- ARGV[3..] field/value pairs
-- Returns {dlq_entry_id, entries_trimmed}.
local out = {}
for i = 3, #ARGV do
  out[#out + 1] = ARGV[i]
end
local t = redis.call('TIME')
out[#out + 1] = ARGV[2]
out[#out + 1] = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local before = redis.call('XLEN', KEYS[1])
local dlq_id
local maxlen = tonumber(ARGV[1])
if maxlen > 0 then
  dlq_id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', unpack(out))
else
  dlq_id = redis.call('XADD', KEYS[1], '*', unpack(out))
end
return {dlq_id, before + 1 - redis.call('XLEN', KEYS[1])}
