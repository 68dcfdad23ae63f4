-- skip_unread.lua: a job cancelled before any consumer read its assignment
-- (Producer.cancel_stream, after cancel_queued.lua removed the assignment) leaves its entries
-- in the data stream; move the service's group past them, so that the next job of the
-- same name starts after them instead of handling them, and mark the job ended, so
-- that what its producer appends later is skipped too (docs/design.md#job-identity).
-- KEYS[1]  data stream
-- KEYS[2]  the stream's ended-job marker for this service (same slot)
-- ARGV[1]  the service's consumer group
-- ARGV[2]  the cancelled job (its first assignment id)
-- ARGV[3]  the ended-job marker's lifetime, milliseconds
-- A missing group is created at the stream's end ('$'); an existing one is moved
-- there. A stream with no TTL expires with the marker (the next add_stream clears
-- it). A key of another type fails before anything is written.
-- Returns 1 if the group now stands at the stream's end, 0 if there is no stream.
--#include pending
--#include skip
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'stream' and t ~= 'none' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a ' .. t .. ', not a stream')
end
-- No consumer saw this job, so none applies its retention (finished_stream_ttl_s);
-- a stream without a TTL gets the marker's lifetime instead of staying for good.
local keep = t == 'stream' and redis.call('PTTL', KEYS[1]) == -1
if t == 'stream' then
  skip_to_end(KEYS[1], ARGV[1])
end
if keep then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
redis.call('SET', KEYS[2], 'e ' .. ARGV[2], 'PX', ARGV[3])
return t == 'stream' and 1 or 0
