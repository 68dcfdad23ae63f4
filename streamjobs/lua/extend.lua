-- extend.lua: extend a lock only if it still holds our token (never re-create it).
-- KEYS[1]  lock key
-- ARGV[1]  lock token
-- ARGV[2]  lock TTL, milliseconds
-- Returns 1 if extended, 0 if the lock is gone or belongs to another acquisition.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
