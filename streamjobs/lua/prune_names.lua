-- prune_names.lua: delete the given consumer names from a stream's group, each only
-- if it has nothing pending (checked in the same script, so nothing can be delivered
-- to a name between the check and the delete).
-- KEYS[1]  stream
-- ARGV[1]  consumer group name
-- ARGV[2..] candidate names
-- Returns the names deleted.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {}
end
local wanted = {}
for i = 2, #ARGV do
  wanted[ARGV[i]] = true
end
local gone = {}
local consumers = redis.pcall('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if consumers['err'] then  -- no such group: nothing to prune
  return {}
end
for _, c in ipairs(consumers) do
  local info = {}
  for i = 1, #c, 2 do
    info[c[i]] = c[i + 1]
  end
  if wanted[info['name']] and tonumber(info['pending']) == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    gone[#gone + 1] = info['name']
  end
end
return gone
