-- dead_letter.lua: atomically move a pending assignment to the dead-letter stream.
-- KEYS[1]  assignment stream (LBS)
-- KEYS[2]  dead-letter stream (same slot)
-- KEYS[3]  lease index (same slot)
-- ARGV[1]  consumer group name
-- ARGV[2]  assignment entry id (also its lease member)
-- ARGV[3]  dead-letter MAXLEN (approximate; 0 = unbounded)
-- ARGV[4]  name of the field that receives the server time, milliseconds
-- ARGV[5..] metadata field/value pairs; they replace original fields of the same name
-- Returns {dlq_entry_id, entries_trimmed}, or false if the entry was not pending.
redis.call('ZREM', KEYS[3], ARGV[2])
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return false
end
local meta = {[ARGV[4]] = true}
for i = 5, #ARGV, 2 do
  meta[ARGV[i]] = true
end
local out = {}
local found = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if #found > 0 then
  local src = found[1][2]
  for i = 1, #src, 2 do
    if not meta[src[i]] then
      out[#out + 1] = src[i]
      out[#out + 1] = src[i + 1]
    end
  end
end
for i = 5, #ARGV do
  out[#out + 1] = ARGV[i]
end
local t = redis.call('TIME')
out[#out + 1] = ARGV[4]
out[#out + 1] = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local before = redis.call('XLEN', KEYS[2])
local dlq_id
local maxlen = tonumber(ARGV[3])
if maxlen > 0 then
  dlq_id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', unpack(out))
else
  dlq_id = redis.call('XADD', KEYS[2], '*', unpack(out))
end
local trimmed = before + 1 - redis.call('XLEN', KEYS[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return {dlq_id, trimmed}
