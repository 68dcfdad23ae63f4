-- _time.lua: the server's clock, included by scripts that read it (--#include time).
local function now_ms() -- Redis server time, milliseconds
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
