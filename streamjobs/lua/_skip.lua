-- _skip.lua: move a consumer group to its stream's last id, creating it there if it
-- is missing (--#include skip). The stream must exist: the caller checked its type.
local function skip_to_end(stream, group)
  local created = redis.pcall('XGROUP', 'CREATE', stream, group, '$')
  if type(created) == 'table' and created['err'] then
    redis.call('XGROUP', 'SETID', stream, group, '$')
  end
end
