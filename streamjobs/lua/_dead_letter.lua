-- _dead_letter.lua: append a dead letter (--#include dead_letter, after --#include time).
-- Writes: the XADD (trimmed with MAXLEN ~ maxlen when maxlen > 0). Everything that can
-- fail (the key's type, the entry's size) must be checked by the caller before.
local function append_dead_letter(key, maxlen, fields, at_field)
  fields[#fields + 1] = at_field
  fields[#fields + 1] = tostring(now_ms())
  local before = redis.call('XLEN', key)
  local id
  if maxlen > 0 then
    id = redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', unpack(fields))
  else
    id = redis.call('XADD', key, '*', unpack(fields))
  end
  return id, before + 1 - redis.call('XLEN', key) -- its id, and the entries trimmed
end
