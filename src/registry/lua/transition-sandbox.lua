-- KEYS: sandbox, unsettled, burstFellBack, burstFellBackFailed, layerRefs
-- ARGV: to, allowedFrom (comma list), terminal ('1'|'0'), tenantLivePrefix, nodePrefix,
--       expectedNode (or ''), then field/value pairs to set
-- Returns: {'ok', from, startedAt or '', pool or ''} | {'refused', currentState} | {'missing'}
-- Besides the record: the tenant's live set and the node's sets (its sandboxes, and those
-- being deleted: what its worker host's audit compares with) follow the state, as does the
-- burst controller's count of diverted creates that fell back, and the counts of sandboxes
-- referring to each layer (its layers and hibernation layer; read by layer garbage
-- collection): none of them is polled per sandbox.
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {'missing'} end
if ARGV[6] ~= '' and redis.call('HGET', KEYS[1], 'node') ~= ARGV[6] then return {'refused', state} end
local allowed = false
for s in string.gmatch(ARGV[2], '[^,]+') do if s == state then allowed = true end end
if not allowed then return {'refused', state} end
local fields = {'state', ARGV[1]}
for i = 7, #ARGV do fields[#fields + 1] = ARGV[i] end
local hibernationBefore = redis.call('HGET', KEYS[1], 'hibernationLayer') or ''
redis.call('HSET', KEYS[1], unpack(fields))
if redis.call('HGET', KEYS[1], 'layerRefs') == '1' then
  local function ref(digest, by)
    if digest == '' then return end
    if redis.call('HINCRBY', KEYS[5], digest, by) <= 0 then redis.call('HDEL', KEYS[5], digest) end
  end
  local hibernation = redis.call('HGET', KEYS[1], 'hibernationLayer') or ''
  if ARGV[3] == '1' then
    for _, digest in ipairs(cjson.decode(redis.call('HGET', KEYS[1], 'layerDigests') or '[]')) do ref(digest, -1) end
    ref(hibernation, -1)
    redis.call('HSET', KEYS[1], 'layerRefs', '0')
  elseif hibernation ~= hibernationBefore then
    ref(hibernationBefore, -1)
    ref(hibernation, 1)
  end
end
local id = redis.call('HGET', KEYS[1], 'id')
local node = redis.call('HGET', KEYS[1], 'node')
if ARGV[1] ~= 'pending' and ARGV[1] ~= 'creating' then redis.call('ZREM', KEYS[2], id) end
if ARGV[1] == 'stopping' and node then redis.call('SADD', ARGV[5] .. node .. ':stopping', id) end
if ARGV[3] == '1' then
  local tenant = redis.call('HGET', KEYS[1], 'tenant')
  redis.call('SREM', ARGV[4] .. tenant .. ':live', id)
  if node then
    redis.call('SREM', ARGV[5] .. node .. ':sbx', id)
    redis.call('SREM', ARGV[5] .. node .. ':stopping', id)
  end
  local fellBackAtMs = redis.call('ZSCORE', KEYS[3], id)
  if fellBackAtMs then
    redis.call('ZREM', KEYS[3], id)
    -- A diverted create that failed still counts as unmet demand for a while.
    if ARGV[1] == 'failed' then redis.call('ZADD', KEYS[4], fellBackAtMs, id) end
  end
end
return {'ok', state, redis.call('HGET', KEYS[1], 'startedAt') or '', redis.call('HGET', KEYS[1], 'pool') or ''}
