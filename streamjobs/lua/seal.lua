-- seal.lua: the data-stream half of completing a stream, done FIRST (fenced).
-- Acks the last handled entries and the end marker, and sets the retention TTL,
-- while the lock is still held. Completing the assignment (finish.lua) and
-- unlocking (release.lua) follow; if the owner dies between them, the next owner
-- of the re-queued assignment finds the end marker handled and only completes it,
-- and the stream already has its final acks and its retention.
-- KEYS[1]  lock key of the data stream (same slot as KEYS[2])
-- KEYS[2]  data stream
-- KEYS[3]  cancel marker of the data stream (same slot)
-- KEYS[4]  the stream's ended-job marker for this service (same slot)
-- ARGV[1]  lock token
-- ARGV[2]  consumer group name
-- ARGV[3]  retention, milliseconds: >0 PEXPIRE; 0 or -1 leave the TTL alone (a
--          stream to delete is deleted by the release, once the assignment is done)
-- ARGV[4]  'cancel' when the stream was cancelled: every entry still pending in the
--          group is acked too (delivered, never to be handled) and the group moves past
--          every entry not yet read; '' otherwise. The cancel marker goes either way: a
--          cancel that came after the stream's own end marker was read is moot.
-- The ended-job marker is set either way, for ARGV[6] ms: 'e <job>' after a cancel
-- or an early finish ('cancel'), 'n <job>' after the end marker. What is appended to
-- the stream from now on belongs to this ended job, and the next job of the name
-- skips it (docs/design.md#job-identity).
-- ARGV[5]  the job (its first assignment id); '' writes no marker
-- ARGV[6]  the ended-job marker's lifetime, milliseconds
-- ARGV[7]  the lock's TTL is cut to at most this many milliseconds (0: left alone).
--          The assignment goes next, then the lock: an owner that dies between the
--          two leaves a lock that expires within this, not the long session-mode TTL
--          (docs/design.md#sessions).
-- ARGV[8..] entry ids to acknowledge
-- Returns 1 if sealed, 0 if the token did not match (nothing done).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
-- Whether the group exists is read before any write: XPENDING on a stream or a
-- group that is gone would fail, and a script is not rolled back.
local has_group = false
if ARGV[4] == 'cancel' and redis.call('EXISTS', KEYS[2]) == 1 then
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[2])) do
    for i = 1, #g, 2 do
      if g[i] == 'name' and g[i + 1] == ARGV[2] then
        has_group = true
      end
    end
  end
end
if #ARGV > 7 then
  redis.call('XACK', KEYS[2], ARGV[2], unpack(ARGV, 8))
end
if ARGV[4] == 'cancel' then
  while has_group do
    local page = redis.call('XPENDING', KEYS[2], ARGV[2], '-', '+', 1000)
    if #page == 0 then
      break
    end
    local ids = {}
    for i = 1, #page do
      ids[i] = page[i][1]
    end
    redis.call('XACK', KEYS[2], ARGV[2], unpack(ids))
  end
  if has_group then  -- what was never read is skipped: a later job starts after it
    redis.call('XGROUP', 'SETID', KEYS[2], ARGV[2], '$')
  end
end
if ARGV[5] ~= '' then
  local kind = ARGV[4] == 'cancel' and 'e ' or 'n '
  redis.call('SET', KEYS[4], kind .. ARGV[5], 'PX', ARGV[6])
end
redis.call('DEL', KEYS[3])
local cap = tonumber(ARGV[7])
if cap > 0 then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 or ttl > cap then
    redis.call('PEXPIRE', KEYS[1], cap)
  end
end
local keep = tonumber(ARGV[3])
if keep > 0 then
  redis.call('PEXPIRE', KEYS[2], keep)
end
return 1
