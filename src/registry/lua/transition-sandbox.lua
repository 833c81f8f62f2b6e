-- A sandbox's state change, on its record alone (one slot: `{sbx:ID}`). The indexes that
-- follow the state (tenant, node, unsettled, layer references) are other slots: the
-- caller updates them from this answer (SandboxRegistry.transition says in what order).
-- KEYS: sandbox
-- ARGV: to, allowedFrom (comma list), terminal ('1'|'0'), expectedNode (or ''), then field/value pairs to set
-- Returns: {'ok', from, startedAt, pool, tenant, node, the layers a terminal move uncounted
--   (json: its layers and hibernation layer; '[]' otherwise), hibernationLayer before,
--   layerRefs counted ('1'|'0')}
--   | {'refused', currentState} | {'missing'}
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {'missing'} end
if ARGV[4] ~= '' and redis.call('HGET', KEYS[1], 'node') ~= ARGV[4] then return {'refused', state} end
local allowed = false
for s in string.gmatch(ARGV[2], '[^,]+') do if s == state then allowed = true end end
if not allowed then return {'refused', state} end
local before = redis.call('HMGET', KEYS[1], 'hibernationLayer', 'layerRefs', 'layerDigests')
local fields = {'state', ARGV[1]}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
local counted = before[2] == '1' and '1' or '0'
local uncount = '[]'
if ARGV[3] == '1' and counted == '1' then
  redis.call('HSET', KEYS[1], 'layerRefs', '0')
  local digests = cjson.decode(before[3] or '[]')
  local hibernation = redis.call('HGET', KEYS[1], 'hibernationLayer') or ''
  if hibernation ~= '' then digests[#digests + 1] = hibernation end
  if #digests > 0 then uncount = cjson.encode(digests) end
end
local after = redis.call('HMGET', KEYS[1], 'startedAt', 'pool', 'tenant', 'node')
return {'ok', state, after[1] or '', after[2] or '', after[3] or '', after[4] or '', uncount, before[1] or '', counted}
