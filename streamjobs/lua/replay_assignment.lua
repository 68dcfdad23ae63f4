-- replay_assignment.lua: put a dead assignment back on the assignment stream, and
-- remove its dead letter, in one step (both keys carry the service's hash tag).
-- Idempotent: a dead letter already replayed (or purged) is gone, and nothing is added.
-- KEYS[1]  dead-letter stream
-- KEYS[2]  assignment stream (LBS)
-- KEYS[3]  active-assignment index (hash)
-- ARGV[1]  the dead letter's id
-- ARGV[2]  the data stream's name ('' if unknown: the index is not touched)
-- ARGV[3..] the assignment's fields and values, as the caller rebuilt them
-- Returns the new assignment's id, or false if the dead letter is gone.
-- The index is checked before the first write; it points at the new assignment
-- unless it already names another unfinished one.
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then
  return false
end
local kind = redis.call('TYPE', KEYS[3])['ok']
local index_ok = ARGV[2] ~= '' and (kind == 'hash' or kind == 'none')
local new_id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
if index_ok then
  redis.call('HSETNX', KEYS[3], ARGV[2], new_id)
end
redis.call('XDEL', KEYS[1], ARGV[1])
return new_id
