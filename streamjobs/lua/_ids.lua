-- _ids.lua: stream id order, included by scripts that compare ids (--#include ids).
local function less(a, b) -- decimal strings without leading zeros
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end
local function older(a, b) -- stream id a < stream id b
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if am ~= bm then
    return less(am, bm)
  end
  return less(as, bs)
end
