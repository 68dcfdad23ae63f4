-- replay_entry.lua: put dead data entries of ONE data stream back on it, in dead-letter
-- order, where a job of that stream hands them to handle() (docs/operations.md#dead-letters).
-- Every key is in the stream's slot, and every read is done before the first write.
--
-- Where they go, decided from what the group has read (its last-delivered id L):
--   * BUSY, nothing written: the stream is being cancelled (its cancel marker exists), or
--     the entry at L is an end marker that is still pending or whose reader still holds
--     the lock: that job is ending, and an entry appended now would come after its end
--     (and a retention of 0 deletes the stream at the release). The caller retries.
--   * the newest entry is an end marker the group has not read (a job, queued or
--     running, still has to reach it; typically the end marker an earlier replay wrote):
--     the entries go BEFORE it. A stream cannot insert, so the marker is deleted and
--     appended again, with its fields, after them. It has not been read, so nobody saw it.
--   * else at the tail. With ARGV[3] = '1' (the caller found no queued job) and no lock
--     (nobody reading), an end marker follows them, so a new job can end.
-- The reply says whether an unread end marker now follows the entries ("closed"): the
-- caller then makes sure a job is queued for the stream. One call per batch: a second
-- batch or a later call finds the first one's marker unread and goes before it.
--
-- An ended-job marker (KEYS[4]: a job of the stream ended, early or at its end
-- marker, and no job started after it) means that everything the group has not read belongs to that ended job:
-- it is skipped (the group moves past it) before the entries are placed, as if it had
-- been read; while that job still holds the lock (it is finishing), BUSY.
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
-- ARGV[3]   '1': no job is queued for the stream (the caller read the assignment index)
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
local ended = redis.call('GET', KEYS[4])
if ended and owned then
  return {'busy', 0, owned_flag}
end
local last = nil -- the group's last-delivered id; nil: no group, nothing read
local has_group = false
local skip_to = nil -- with an ended job: the id the group moves to (its rest skipped)
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
      last, has_group = id, true
    end
  end
  if ended then
    local top = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
    if #top > 0 and (last == nil or older(last, top[1][1])) then
      skip_to, last = top[1][1], top[1][1]
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

local ending = redis.call('EXISTS', KEYS[3]) == 1
if not ending and last ~= nil and last ~= '0-0' then
  local read = redis.call('XRANGE', stream, last, last)
  if #read > 0 and is_eos(read[1][2]) then
    ending = owned or #redis.call('XPENDING', stream, group, last, last, 1) > 0
  end
end
if ending then
  return {'busy', 0, owned_flag}
end

local tail = nil -- the newest entry, if it is an end marker nobody read
if kind == 'stream' then
  local top = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
  if #top > 0 and is_eos(top[1][2]) and unread(top[1][1]) then
    tail = top[1]
    if #tail[2] > max_values then
      return redis.error_reply('TOOLARGE end marker ' .. tail[1] .. ' of ' .. stream)
    end
  end
end

-- Writes.
local closed = tail ~= nil
local wrote = false
if #fresh > 0 and ended then
  if skip_to and has_group then
    redis.call('XGROUP', 'SETID', stream, group, skip_to)
  elseif skip_to then
    redis.call('XGROUP', 'CREATE', stream, group, skip_to)
  end
  redis.call('DEL', KEYS[4])
end
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
if not closed and ARGV[3] == '1' and not owned then
  redis.call('XADD', stream, '*', eos_field, eos_value)
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
