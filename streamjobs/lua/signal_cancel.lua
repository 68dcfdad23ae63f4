-- signal_cancel.lua: the data-stream half of cancelling a stream (Producer.cancel_stream):
-- the cancel marker, then an end marker carrying the reason that wakes an owner
-- waiting for entries. One script, so an owner woken by the entry always finds the
-- marker, and the seal that ends the stream always removes it (written the other
-- way round, the woken owner could end the stream and drop the marker before it was
-- written, leaving it behind for a day).
-- KEYS[1]  data stream
-- KEYS[2]  its cancel marker (same slot)
-- ARGV[1]  reason (may be empty)
-- ARGV[2]  marker TTL, milliseconds
-- ARGV[3]  end-of-stream field name
-- ARGV[4]  end-of-stream field value
-- ARGV[5]  cancel-reason field name
-- The end marker is not appended if the stream does not exist, or if its newest entry
-- is already an end marker: that job is ending anyway, and a second marker would be
-- read first by the next job of the same name, cancelling it (issue: a job is its own).
-- Returns 1 if the end marker was appended, 0 if not.
-- Reads (the key types, the newest entry) come before the first write.
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'stream' and t ~= 'none' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a ' .. t .. ', not a stream')
end
local append = false
if t == 'stream' then
  append = true
  local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  if #top > 0 then
    local fields = top[1][2]
    for i = 1, #fields, 2 do
      if fields[i] == ARGV[3] and fields[i + 1] == ARGV[4] then
        append = false
      end
    end
  end
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
if append then
  redis.call('XADD', KEYS[1], '*', ARGV[3], ARGV[4], ARGV[5], ARGV[1])
  return 1
end
return 0
