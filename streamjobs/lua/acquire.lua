-- acquire.lua: take the lock of a data stream and make sure its consumer group exists.
-- KEYS[1]  lock key of the data stream (same slot as KEYS[2])
-- KEYS[2]  data stream
-- KEYS[3]  the stream's ended-job marker for this service (same slot)
-- ARGV[1]  lock token, unique to this acquisition
-- ARGV[2]  lock TTL, milliseconds
-- ARGV[3]  consumer group name
-- ARGV[4]  a token to replace: a dead session's, which the caller read from this lock
--          and found dead (docs/design.md#liveness); '' takes only a free lock
-- ARGV[5]  the job of the assignment being acquired (its _first_id, or its id)
-- Returns 1 if the lock was taken, 0 if someone else holds it, 2 if it was taken but
-- this job already ended (the ended-job marker, 'e <job>' or 'n <job>', names it; its
-- owner died before completing the assignment): the caller only completes it.
-- A marker of another job goes: after an early end ('e') the group first moves to the
-- stream's end (what was appended since belongs to that job); after a normal end ('n')
-- it stays (a job queued without add_stream, e.g. in the Go form, reads what is there).
-- Producer.add_stream has already skipped it (start_job.lua) for jobs it queues.
-- Idempotent: a client retry of a call whose reply was lost finds its own token, and
-- refreshes the TTL, since the caller measures its local lease from the retry.
-- Reads (the lock, the marker: a key of another type fails here) come first.
--#include pending
--#include skip
local holder = redis.call('GET', KEYS[1])
local ended = redis.call('GET', KEYS[3])
local ended_kind, ended_job = nil, nil
if ended then
  ended_kind, ended_job = string.sub(ended, 1, 1), string.sub(ended, 3)
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if ended_job == ARGV[5] then
    return 2
  end
  return 1
end
if holder and (ARGV[4] == nil or ARGV[4] == '' or holder ~= ARGV[4]) then
  return 0
end
if holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
elseif not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 0
end
-- Group at id 0 with MKSTREAM: entries appended before the first owner must not be
-- skipped, and the stream may not exist yet. BUSYGROUP (group exists) is expected.
-- Any other error (WRONGTYPE: the key is not a stream) is returned after the lock
-- is given up: the only write so far.
local ok = redis.pcall('XGROUP', 'CREATE', KEYS[2], ARGV[3], '0', 'MKSTREAM')
-- tostring: the error is a string on Redis and Valkey; an in-memory server (fakeredis,
-- docs/testing.md) hands it over as an object of its own.
if type(ok) == 'table' and ok.err and not string.find(tostring(ok.err), 'BUSYGROUP', 1, true) then
  redis.call('DEL', KEYS[1])
  return redis.error_reply(tostring(ok.err))
end
-- A new job for a stream name that finished recently: the retention TTL set then
-- must not expire the new job's entries.
redis.call('PERSIST', KEYS[2])
if ended then
  if ended_job == ARGV[5] then
    return 2  -- this job ended; its owner died before completing it
  end
  if ended_kind == 'e' then
    -- An earlier job of this name ended early: what was appended after its end
    -- belongs to it, and this job starts after it (docs/design.md#job-identity).
    skip_to_end(KEYS[2], ARGV[3])
  end
  redis.call('DEL', KEYS[3])
end
return 1
