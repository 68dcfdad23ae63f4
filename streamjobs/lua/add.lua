-- add.lua: queue an assignment unless its data stream already has an unfinished one
-- (docs/design.md#submission). The active-assignment index maps a data stream's name to
-- the id of the assignment add.lua queued for it; finish, re-queue and dead-letter keep
-- it up to date. A pointer to an entry that no longer exists counts as no pointer.
-- Redis does not roll a script back, so every key's type is checked before the first
-- write (XADD).
-- KEYS[1]  assignment stream (LBS)
-- KEYS[2]  active-assignment index (hash: data stream name -> assignment id; same slot)
-- KEYS[3]  optional: the idempotency key of this submission (string; same slot)
-- ARGV[1]  data stream name
-- ARGV[2]  how long the idempotency key lives, milliseconds (with KEYS[3])
-- ARGV[3..] the new assignment's field/value pairs
-- Returns {id, 1} for an assignment queued now, {id, 0} for an earlier one: the id the
-- idempotency key recorded (even if that job has finished), else the stream's
-- unfinished assignment. Fails with 'WRONGTYPE ...', writing nothing, if a key holds
-- another type.
local expected = {'stream', 'hash', 'string'}
for i = 1, #KEYS do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind ~= expected[i] and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[i] .. ' holds a ' .. kind ..
      ', not a ' .. expected[i])
  end
end
if #KEYS > 2 then
  local earlier = redis.call('GET', KEYS[3])
  if earlier then
    return {earlier, 0}
  end
end
local id = nil
local current = redis.call('HGET', KEYS[2], ARGV[1])
if current then
  -- pcall: a value that is not a stream id (written by hand) counts as no pointer.
  local found = redis.pcall('XRANGE', KEYS[1], current, current)
  if found.err == nil and #found > 0 then
    id = current
  end
end
local created = 0
if id == nil then
  id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
  redis.call('HSET', KEYS[2], ARGV[1], id)
  created = 1
end
if #KEYS > 2 then
  redis.call('SET', KEYS[3], id, 'NX', 'PX', ARGV[2])
end
return {id, created}
