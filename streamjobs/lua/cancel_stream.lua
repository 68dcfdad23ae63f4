-- cancel_stream.lua: the data-stream half of cancelling a stream (Producer.cancel_stream):
-- the cancel marker, then an end marker carrying the reason that wakes an owner
-- waiting for entries. One script, so an owner woken by the entry always finds the
-- marker, and the seal that ends the stream always removes it (written the other
-- way round, the woken owner could end the stream and drop the marker before it was
-- written, leaving it behind for a day).
-- KEYS[1]  data stream
-- KEYS[2]  its cancel marker (same slot)
-- KEYS[3]  its ended-job marker for this service (same slot)
-- ARGV[1]  reason (may be empty)
-- ARGV[2]  marker TTL, milliseconds
-- ARGV[3]  end-of-stream field name
-- ARGV[4]  end-of-stream field value
-- ARGV[5]  cancel-reason field name
-- ARGV[6]  the service's consumer group
-- ARGV[7]  the job being cancelled (its first assignment id), '' if unknown
-- A cancel is moot, and nothing is written, when the job is over already: the ended-job
-- marker names it (or, with the job unknown, exists: then the lock holder is that ended
-- job finishing), or the group has read the stream's newest entry and it is an end
-- marker newer than the job (the job is finishing normally). A marker written then
-- would outlive the job.
-- Otherwise the marker is written, and the end marker appended, except when the stream
-- does not exist (no owner waits on it), or when its newest entry is an end marker
-- newer than the job (or the job is unknown): that is the job's own end, unread yet,
-- whose read finds the cancel marker. An end marker no newer than the job is an earlier
-- job's, read or skipped: the job's owner waits for entries after it and only the
-- appended one wakes it (what the cancelled job leaves is skipped by the next job of
-- the name, docs/design.md#job-identity). Equal ids count as an earlier job's: the
-- previous job's end marker and this job's assignment, in two streams, get the same id
-- when written in one millisecond (on a fast server, a job can end and the next be
-- queued within one). Read the other way, the cancel was lost and the idle job kept
-- its stream for good; this way, a cancel racing a job's own end in its first
-- millisecond leaves a marker that the job's seal or the next add_stream removes.
-- Returns 1 if the end marker was appended, 0 if only the marker was written, 2 if moot.
-- Reads (the key types, the newest entry, the group) come before the first write.
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'stream' and t ~= 'none' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a ' .. t .. ', not a stream')
end
local ended = redis.call('GET', KEYS[3])
if ended and (ARGV[7] == '' or string.sub(ended, 3) == ARGV[7]) then
  return 2
end

--#include ids

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
    if not append then  -- it ends in an end marker: has the group read it?
      -- (one no newer than the job is an earlier job's: this job's owner needs waking)
      append = ARGV[7] ~= '' and not older(ARGV[7], top[1][1])
      for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
        local name, last
        for j = 1, #g, 2 do
          if g[j] == 'name' then
            name = g[j + 1]
          elseif g[j] == 'last-delivered-id' then
            last = g[j + 1]
          end
        end
        -- (an end marker no newer than the job belongs to an earlier job of the name:
        -- ids of two streams written in one millisecond can be equal)
        if name == ARGV[6] and last and not older(last, top[1][1])
            and (ARGV[7] == '' or older(ARGV[7], top[1][1])) then
          return 2
        end
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
