-- start_job.lua: the data-stream half of Producer.add_stream, called before add.lua
-- (ARGV[2] = '') and, when add.lua queued a new job, after it (docs/design.md#job-identity).
-- KEYS[1]  data stream
-- KEYS[2]  its cancel marker
-- KEYS[3]  its ended-job marker for this service ('e <job>' or 'n <job>')
-- ARGV[1]  the service's consumer group
-- ARGV[2]  the job add.lua answered (its first assignment id); '' before add.lua
-- ARGV[3]  '1' if add.lua queued it now: a retention TTL and a cancel marker left by
--          an earlier job of the name go (they must not expire or cancel this one)
-- If a job of the name ended (the marker exists and names another job, or any job
-- before add.lua), whatever was appended after its end belongs to it: the group moves
-- to the stream's end (made there if missing), so the new job starts after it, and
-- the marker goes. A marker exists only while no job started since that end, so
-- add.lua then queues a new job (or answers an idempotency key's finished job). The
-- caller appends the new job's entries once add_stream returned. A marker naming this
-- very job (a repeat answered from its idempotency key) is kept.
-- A data stream key of another type is left to the consumer (it dead-letters the
-- assignment as unusable_stream): nothing here fails on it.
-- Reads (the key's type, the marker) come before the first write.
-- Returns 1 if something was skipped, else 0.
--#include pending
--#include skip
local t = redis.call('TYPE', KEYS[1])['ok']
local ended = redis.call('GET', KEYS[3])
if ARGV[3] == '1' then
  if t ~= 'none' then
    redis.call('PERSIST', KEYS[1])
  end
  redis.call('DEL', KEYS[2])
end
if ended and string.sub(ended, 3) ~= ARGV[2] then
  if t == 'stream' then
    skip_to_end(KEYS[1], ARGV[1])
  end
  redis.call('DEL', KEYS[3])
  return 1
end
return 0
