-- finish.lua: complete an assignment: ack and delete it, forget its lease and its entry
-- in the active-assignment index.
-- Runs BEFORE the lock is released: between the two, a recoverer sees either no
-- pending entry or a live lock, never "pending without a lock".
-- KEYS[1]  assignment stream (LBS)
-- KEYS[2]  lease index (sorted set, same slot)
-- KEYS[3]  active-assignment index (hash: data stream name -> assignment id, same slot)
-- ARGV[1]  consumer group name
-- ARGV[2]  assignment entry id (also its lease member)
-- ARGV[3]  name of the field holding the data stream's name
-- Returns 1 if this call completed it, 0 if it was no longer pending (re-queued by a
-- recoverer: the caller lost the stream).
-- The index entry of the stream goes only if it points at this assignment (another
-- assignment of the same stream, written by other means, never moves it). An index
-- that is not a hash is left alone (add.lua reports it). Every read comes first.
--#include pending
--#include fields
--#include complete
local name, indexed = finish_reads(KEYS[1], KEYS[3], ARGV[2], ARGV[3])
return finish_writes(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], name, indexed)
