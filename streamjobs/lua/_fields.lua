-- _fields.lua: one field of a stream entry (--#include fields; included before the
-- helpers that use it).
local function entry_field(stream, id, name)
  -- The value of field ``name`` of entry ``id`` of ``stream``; nil if the entry or
  -- the field is missing.
  local found = redis.call('XRANGE', stream, id, id)
  if #found == 0 then
    return nil
  end
  local fields = found[1][2]
  for i = 1, #fields, 2 do
    if fields[i] == name then
      return fields[i + 1]
    end
  end
  return nil
end
