-- requeue.lua: atomically move a pending assignment to the tail of the LBS.
-- XACK first: if it returns 0 another recoverer (or the finishing owner) won, and we
-- stop. Being one script closes the crash window between XACK and XADD.
-- Redis does not roll a script back, so everything that can fail is checked before
-- the first write: the entry is read first (a key of another type fails there), and
-- a copy too large for one XADD is refused while the entry is still pending.
-- KEYS[1]  assignment stream (LBS)
-- KEYS[2]  lease index (same slot)
-- KEYS[3]  active-assignment index (hash: data stream name -> assignment id, same slot)
-- ARGV[1]  consumer group name
-- ARGV[2]  assignment entry id (also its lease member)
-- ARGV[3]  name of the retry-count field
-- ARGV[4]  new retry count ('' keeps the entry's own value: graceful hand-back)
-- ARGV[5]  the most field names and values one XADD may carry
-- ARGV[6]  name of the field holding the data stream's name
-- ARGV[7]  name of the field that keeps the id of the first submission: the copy gets
--          it if the original has none (a new job's entries are newer than it; see
--          docs/design.md#finishing-and-hand-back)
-- ARGV[8]  name of the field recording when the previous owner was lost (its lock's
--          deadline, server ms): the consumer that resumes the copy measures recovery
--          latency from it
-- ARGV[9]  that time: digits (the caller knows it), 'lease' (the entry's lease
--          deadline, or now if it has none or it lies ahead), or '' (not a loss: a
--          hand-back or an owner's own re-queue; the field is left off the copy)
-- Returns the new entry id, or false if the entry was not pending / no longer exists.
-- The lease is forgotten either way: an entry that is not pending under this id has
-- no live lease under it.
-- Fails with 'TOOLARGE ...', writing nothing, if the copy would exceed ARGV[5] values
-- while the entry is pending (the caller dead-letters it instead).
-- The copy takes the original's place in the active-assignment index, only if the index
-- points at the original (another assignment of the same stream, written by other
-- means, never moves it). An index that is not a hash is left alone (add.lua reports
-- it).
--#include time
local found = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
local out = nil
local name = nil
local lost_at = ARGV[9]
if lost_at == 'lease' then
  local now = now_ms()
  local score = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[2]))
  if score == nil or score > now then
    score = now
  end
  lost_at = string.format('%d', score)
end
if #found > 0 then
  local src = found[1][2]
  out = {}
  local seen = false
  local first_seen = false
  for i = 1, #src, 2 do
    local field = src[i]
    if field ~= ARGV[8] then
      out[#out + 1] = field
      if field == ARGV[6] then
        name = src[i + 1]
      end
      if field == ARGV[7] then
        first_seen = true
      end
      if field == ARGV[3] and ARGV[4] ~= '' then
        seen = true
        out[#out + 1] = ARGV[4]
      else
        out[#out + 1] = src[i + 1]
      end
    end
  end
  if lost_at ~= '' then
    out[#out + 1] = ARGV[8]
    out[#out + 1] = lost_at
  end
  if not seen and ARGV[4] ~= '' then
    out[#out + 1] = ARGV[3]
    out[#out + 1] = ARGV[4]
  end
  if not first_seen then
    out[#out + 1] = ARGV[7]
    out[#out + 1] = ARGV[2]
  end
  if #out > tonumber(ARGV[5]) then
    local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
    if #p == 0 then
      redis.call('ZREM', KEYS[2], ARGV[2])
      return false
    end
    return redis.error_reply('TOOLARGE assignment ' .. ARGV[2] .. ' has ' .. (#src / 2) ..
      ' fields: a re-queue copies at most ' .. math.floor(tonumber(ARGV[5]) / 2))
  end
end
local indexed = name ~= nil and redis.call('TYPE', KEYS[3])['ok'] == 'hash' and
  redis.call('HGET', KEYS[3], name) == ARGV[2]
redis.call('ZREM', KEYS[2], ARGV[2])
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 or out == nil then
  return false
end
local new_id = redis.call('XADD', KEYS[1], '*', unpack(out))
redis.call('XDEL', KEYS[1], ARGV[2])
if indexed then
  redis.call('HSET', KEYS[3], name, new_id)
end
return new_id
