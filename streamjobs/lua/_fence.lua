-- _fence.lua: the fence of a read of a data stream (--#include fence), shared by
-- fence.lua and claim.lua. The lock must hold the token; the cancel marker is read
-- before the first write (a script is not rolled back), then ARGV[ack_from..] are
-- acknowledged. Returns false if the token does not match (nothing acked), else
-- true and the cancel reason (false when the stream is not cancelled).
local function fence(lock, token, stream, group, cancel_marker, ack_from)
  if redis.call('GET', lock) ~= token then
    return false, false
  end
  local cancelled = redis.call('GET', cancel_marker)
  if #ARGV >= ack_from then
    redis.call('XACK', stream, group, unpack(ARGV, ack_from))
  end
  return true, cancelled
end
