-- skip_unread.lua: a job cancelled before any consumer read its assignment
-- (Producer.cancel_stream, after cancel.lua removed the assignment) leaves its entries
-- in the data stream; move the service's group past them, so that the next job of the
-- same name starts after them instead of handling them (issue: a job is its own).
-- KEYS[1]  data stream
-- ARGV[1]  the service's consumer group
-- A stream that does not exist has nothing to skip. A missing group is created at the
-- stream's end ('$'); an existing one is moved there. The one write is the last call.
-- Returns 1 if the group now stands at the stream's end, 0 if there is no stream.
if redis.call('TYPE', KEYS[1])['ok'] ~= 'stream' then
  return 0
end
local created = redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], '$')
if type(created) == 'table' and created['err'] then
  if not string.find(created['err'], 'BUSYGROUP', 1, true) then
    return redis.error_reply(created['err'])
  end
  redis.call('XGROUP', 'SETID', KEYS[1], ARGV[1], '$')
end
return 1
