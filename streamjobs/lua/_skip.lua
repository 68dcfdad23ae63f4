-- _skip.lua: move a consumer group past everything in its stream, which belongs to a job
-- that ended (--#include skip, after --#include pending). The stream must exist: the
-- caller checked its type.
-- The group goes to the stream's last id (made there if it is missing), and whatever is
-- pending in it is acked: a stalled owner's read queued behind its own failed fence
-- (fence.lua) still delivers entries, so entries appended after the end may be pending
-- with that owner; the next job's owner would claim them first, as its own.
local function skip_to_end(stream, group)
  local created = redis.pcall('XGROUP', 'CREATE', stream, group, '$')
  if type(created) == 'table' and created['err'] then
    redis.call('XGROUP', 'SETID', stream, group, '$')
  end
  ack_pending(stream, group)
end
