-- replay_entry.lua: put dead data entries of ONE data stream back on it, in dead-letter
-- order, where a job of that stream hands them to handle() (docs/operations.md#dead-letters).
-- Every key is in the stream's slot, and every read is done before the first write.
-- The caller has made sure that a job of the entries is queued (docs/design.md#job-identity):
-- the running job they came from, or a run of that job it queued for them (a replay run:
-- ARGV[3] = 'run'), always BEFORE they are placed, so a job queued by add_stream meanwhile
-- is refused by the caller instead of reading them.
--
-- Where they go, decided from what the group has read (its last-delivered id L):
--   * BUSY, nothing written: a job of the stream ended and no job started since (its
--     ended-job marker KEYS[4] exists: the caller queues a new run first); the stream is
--     being cancelled (its cancel marker exists); or the entry at L is an end marker that
--     is still pending, or (joining a queued job) whose reader still holds the lock: that
--     job is ending, and an entry appended now would come after its end. The caller
--     retries. (For a replay run the lock is its own owner's, or that of the previous
--     job, which has finished its assignment: the end marker at L is not this run's.)
--   * the newest entry is an end marker the group has not read (a job, queued or
--     running, still has to reach it; typically the end marker an earlier replay wrote):
--     the entries go BEFORE it. A stream cannot insert, so the marker is deleted and
--     appended again, with its fields, after them. It has not been read, so nobody saw it.
--   * else at the tail; for a replay run an end marker follows them, so the run ends.
-- The reply says whether an unread end marker now follows the entries ("closed").
-- One call per batch: a second batch or a later call finds the first one's marker unread
-- and goes before it.
--
-- A replay marker (KEYS[5..], one per dead letter) remembers for a day the id that dead
-- letter's replay appended: a repeat (a second operator, or a retry after a crash before
-- the dead letter was removed) appends nothing for it and answers the same id.
--
-- KEYS[1]   data stream
-- KEYS[2]   its lock
-- KEYS[3]   its cancel marker
-- KEYS[4]   its ended-job marker for this service
-- KEYS[5..] the replay marker of each dead letter, in dead-letter order
-- ARGV[1]   the service's consumer group
-- ARGV[2]   the replay markers' lifetime, milliseconds
-- ARGV[3]   'run': the queued job is a replay run of the entries; '': another job
-- ARGV[4]   the end marker's field; ARGV[5] its value
-- ARGV[6]   the most values one XADD may take (MAX_COPY_VALUES)
-- ARGV[7..] per dead letter, in KEYS order: the number of values n, then its n field
--           names and values
-- Returns {state, closed (1/0), owned (1/0), id per dead letter...}:
--   'busy'      nothing written, no ids;
--   'placed'    every entry is in the stream, at least one not read by the group yet;
--   'delivered' every one was appended by an earlier call and the group read them all
--               (or the stream is gone: its jobs ended and their retention removed it).
local stream, group = KEYS[1], ARGV[1]
local eos_field, eos_value = ARGV[4], ARGV[5]
local max_values = tonumber(ARGV[6])
local ttl = tonumber(ARGV[2])
if not ttl or ttl < 1 or ttl % 1 ~= 0 then
  return redis.error_reply('ERR replay marker lifetime must be a positive integer')
end

--#include ids
local function has_field(fields, name)
  for i = 1, #fields, 2 do
    if fields[i] == name then
      return true
    end
  end
  return false
end
local function is_eos(fields)
  for i = 1, #fields, 2 do
    if fields[i] == eos_field and fields[i + 1] == eos_value then
      return true
    end
  end
  return false
end

-- The dead letters: where each one's values start in ARGV, and which were replayed.
local n = #KEYS - 4
if n < 1 then
  return redis.error_reply('ERR no dead letter to replay')
end
local ids, first, count, fresh = {}, {}, {}, {}
local newest = nil -- the newest id an earlier call appended
local at = 7
for i = 1, n do
  local c = at <= #ARGV and tonumber(ARGV[at]) or nil
  if not c or c < 2 or c % 2 ~= 0 or c > max_values or at + c > #ARGV then
    return redis.error_reply('ERR bad field count for dead letter ' .. i)
  end
  first[i], count[i] = at + 1, c
  at = at + 1 + c
  local done = redis.call('GET', KEYS[4 + i])
  if done then
    ids[i] = done
    if newest == nil or older(newest, done) then
      newest = done
    end
  else
    fresh[#fresh + 1] = i
  end
end

local kind = redis.call('TYPE', stream)['ok']
if kind ~= 'none' and kind ~= 'stream' then
  return redis.error_reply('WRONGTYPE ' .. stream .. ' is not a stream')
end
local owned = redis.call('EXISTS', KEYS[2]) == 1
local owned_flag = owned and 1 or 0
local run = ARGV[3] == 'run'
local last = nil -- the group's last-delivered id; nil: no group, nothing read
if kind == 'stream' then
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local name, id
    for j = 1, #g, 2 do
      if g[j] == 'name' then
        name = g[j + 1]
      elseif g[j] == 'last-delivered-id' then
        id = g[j + 1]
      end
    end
    if name == group then
      last = id
    end
  end
end
local function unread(id)
  return last == nil or older(last, id)
end

if #fresh == 0 and (kind == 'none' or not unread(newest)) then
  local reply = {'delivered', 0, owned_flag}
  for i = 1, n do
    reply[3 + i] = ids[i]
  end
  return reply
end

local ending = redis.call('EXISTS', KEYS[3]) == 1 or redis.call('EXISTS', KEYS[4]) == 1
if not ending and last ~= nil and last ~= '0-0' then
  local read = redis.call('XRANGE', stream, last, last)
  if #read > 0 and is_eos(read[1][2]) then
    ending = (owned and not run) or #redis.call('XPENDING', stream, group, last, last, 1) > 0
  end
end
if ending then
  return {'busy', 0, owned_flag}
end

local tail = nil -- the newest entry, if it is an end marker nobody read
if kind == 'stream' then
  local top = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
  -- A run goes before its own unread end marker only: another end marker there (its
  -- ended job's producer closed it late) is that job's, and the run skips it.
  if #top > 0 and is_eos(top[1][2]) and unread(top[1][1])
      and (not run or has_field(top[1][2], '_replay_end')) then
    tail = top[1]
    if #tail[2] > max_values then
      return redis.error_reply('TOOLARGE end marker ' .. tail[1] .. ' of ' .. stream)
    end
  end
end

-- Writes.
local closed = tail ~= nil
local wrote = false
if #fresh > 0 then
  if tail then
    redis.call('XDEL', stream, tail[1])
  end
  for _, i in ipairs(fresh) do
    ids[i] = redis.call('XADD', stream, '*', unpack(ARGV, first[i], first[i] + count[i] - 1))
    redis.call('SET', KEYS[4 + i], ids[i], 'PX', ttl)
  end
  if tail then
    -- The marker again, after them. Its first copy is deleted at once, so that the
    -- stream's newest tombstone is newer than the entries: Redis 7.0 counts a group's
    -- entries-read past a tombstone older than the entry it delivers as if there were
    -- none (its lag would then stay 1 above the truth, and `status` would never show
    -- the stream finished); with one newer, it re-counts and the lag ends at 0.
    redis.call('XDEL', stream, redis.call('XADD', stream, '*', unpack(tail[2])))
    redis.call('XADD', stream, '*', unpack(tail[2]))
  end
  wrote = true
end
if not closed and run then
  -- The run's own end marker (_wire.REPLAY_END_FIELD): the run ends only at one.
  redis.call('XADD', stream, '*', eos_field, eos_value, '_replay_end', '1')
  closed, wrote = true, true
end
if wrote then
  redis.call('PERSIST', stream)
end
local reply = {'placed', closed and 1 or 0, owned_flag}
for i = 1, n do
  reply[3 + i] = ids[i]
end
return reply
