-- _pending.lua: ack every entry still pending in a consumer group (--#include pending;
-- included before the helpers that use it). The group must exist: the caller checked.
local function ack_pending(stream, group)
  while true do
    local page = redis.call('XPENDING', stream, group, '-', '+', 1000)
    if #page == 0 then
      return
    end
    local ids = {}
    for i = 1, #page do
      ids[i] = page[i][1]
    end
    redis.call('XACK', stream, group, unpack(ids))
  end
end
