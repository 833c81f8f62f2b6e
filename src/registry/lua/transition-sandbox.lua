-- KEYS: sandbox, unsettled
-- ARGV: to, allowedFrom (comma list), terminal ('1'|'0'), tenantLivePrefix, nodeSandboxesPrefix,
--       expectedNode (or ''), then field/value pairs to set
-- Returns: {'ok', from} | {'refused', currentState} | {'missing'}
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {'missing'} end
if ARGV[6] ~= '' and redis.call('HGET', KEYS[1], 'node') ~= ARGV[6] then return {'refused', state} end
local allowed = false
for s in string.gmatch(ARGV[2], '[^,]+') do if s == state then allowed = true end end
if not allowed then return {'refused', state} end
local fields = {'state', ARGV[1]}
for i = 7, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
if ARGV[1] ~= 'pending' and ARGV[1] ~= 'creating' then redis.call('ZREM', KEYS[2], redis.call('HGET', KEYS[1], 'id')) end
if ARGV[3] == '1' then
  local tenant = redis.call('HGET', KEYS[1], 'tenant')
  local node = redis.call('HGET', KEYS[1], 'node')
  local id = redis.call('HGET', KEYS[1], 'id')
  redis.call('SREM', ARGV[4] .. tenant .. ':live', id)
  if node then redis.call('SREM', ARGV[5] .. node .. ':sbx', id) end
end
return {'ok', state}
