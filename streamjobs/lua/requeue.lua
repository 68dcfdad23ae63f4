-- requeue.lua: atomically move a pending assignment to the tail of the LBS.
-- XACK first: if it returns 0 another recoverer (or the finishing owner) won, and we
-- stop. Being one script closes the crash window between XACK and XADD.
-- KEYS[1]  assignment stream (LBS)
-- KEYS[2]  lease index (same slot)
-- ARGV[1]  consumer group name
-- ARGV[2]  assignment entry id (also its lease member)
-- ARGV[3]  name of the retry-count field
-- ARGV[4]  new retry count ('' keeps the entry's own value: graceful hand-back)
-- Returns the new entry id, or false if the entry was not pending / no longer exists.
-- The lease is forgotten either way: an entry that is not pending under this id has
-- no live lease under it.
redis.call('ZREM', KEYS[2], ARGV[2])
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return false
end
local found = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if #found == 0 then
  return false
end
local src = found[1][2]
local out = {}
local seen = false
for i = 1, #src, 2 do
  if src[i] == ARGV[3] then
    seen = true
    if ARGV[4] ~= '' then
      out[#out + 1] = ARGV[3]
      out[#out + 1] = ARGV[4]
    else
      out[#out + 1] = src[i]
      out[#out + 1] = src[i + 1]
    end
  else
    out[#out + 1] = src[i]
    out[#out + 1] = src[i + 1]
  end
end
if not seen and ARGV[4] ~= '' then
  out[#out + 1] = ARGV[3]
  out[#out + 1] = ARGV[4]
end
local new_id = redis.call('XADD', KEYS[1], '*', unpack(out))
redis.call('XDEL', KEYS[1], ARGV[2])
return new_id
