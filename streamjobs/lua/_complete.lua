-- _complete.lua: the three steps of completing a stream (--#include complete, after
-- --#include pending and --#include fields), each a function so that seal.lua, finish.lua and release.lua
-- run one each (a cluster: the data stream's slot, the service's slot, the data
-- stream's slot), and complete.lua runs all three at once where every key lives on
-- one server.

-- Whether the stream exists and has the group, read before any write: XINFO or
-- XPENDING on a stream or group that is gone would fail, and a script is not rolled
-- back.
local function group_exists(stream, group)
  if redis.call('EXISTS', stream) == 0 then
    return false
  end
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    for i = 1, #g, 2 do
      if g[i] == 'name' and g[i + 1] == group then
        return true
      end
    end
  end
  return false
end

local function seal_reads(stream, group, cancel)
  return group_exists(stream, group)
end


-- Acks, the skip after a cancel, the ended-job marker, the cancel marker's removal,
-- the lock's TTL cut and the retention (seal.lua's header says what each is for).
local function seal_writes(lock, stream, cancel_key, ended, group, keep, cancel,
                           has_group, job, ended_ttl, lock_cap, acks)
  if #acks > 0 then
    redis.call('XACK', stream, group, unpack(acks))
  end
  if has_group then
    -- The job is over: what is pending now was delivered and will never be handled
    -- (after a cancel, or read past the end marker by a consumer whose acquisition
    -- failed while the owner held the lock).
    ack_pending(stream, group)
    if cancel then  -- what was never read is skipped: a later job starts after it
      redis.call('XGROUP', 'SETID', stream, group, '$')
    end
  end
  if job ~= '' then
    local kind = cancel and 'e ' or 'n '
    redis.call('SET', ended, kind .. job, 'PX', ended_ttl)
  end
  redis.call('DEL', cancel_key)
  if lock_cap > 0 then  -- (no PTTL first: the consumer's ACL has no +pttl, and a
    -- lock-mode lock lives lock_ttl_s anyway)
    redis.call('PEXPIRE', lock, lock_cap)
  end
  if keep > 0 then
    redis.call('PEXPIRE', stream, keep)
  end
end

-- finish.lua's reads: the assignment's stream name, and whether the active-assignment
-- index points at this assignment (an index that is not a hash is left alone).
local function finish_reads(lbs, active, id, field)
  local name = entry_field(lbs, id, field)
  local indexed = name ~= nil and redis.call('TYPE', active)['ok'] == 'hash' and
    redis.call('HGET', active, name) == id
  return name, indexed
end

-- Ack and delete the assignment, forget its lease and its index entry; 1 if this call
-- completed it, 0 if it was no longer pending.
local function finish_writes(lbs, leases, active, group, id, name, indexed)
  local acked = redis.call('XACK', lbs, group, id)
  redis.call('ZREM', leases, id)
  if acked == 1 then
    redis.call('XDEL', lbs, id)
    if indexed then
      redis.call('HDEL', active, name)
    end
  end
  return acked
end

-- Unlock (the token was checked by the caller) and apply "delete at once".
-- drain: the job ended (a release after the seal): ack what is still pending, since
-- a contender may have read past the end marker between the seal and this release
-- (has_group, read by the caller first, says the group exists).
local function release_writes(lock, stream, group, keep, acks, drain)
  if #acks > 0 then
    redis.call('XACK', stream, group, unpack(acks))
  end
  if drain then
    ack_pending(stream, group)
  end
  redis.call('DEL', lock)
  if keep == 0 then
    redis.call('DEL', stream)
  elseif keep > 0 then
    redis.call('PEXPIRE', stream, keep)
  end
end
