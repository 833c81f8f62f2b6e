-- A sandbox's state change, on its record alone (one slot: `{sbx:ID}`). The indexes that
-- follow the state (tenant, node, unsettled, layer references) are other slots: the
-- caller updates them from this answer (SandboxRegistry.transition says in what order).
-- One read and one write (a create makes two transitions, a delete two more: bench:scale
-- counts every call a script makes).
-- KEYS: sandbox
-- ARGV: to, allowedFrom (comma list), terminal ('1'|'0'), expectedNode (or ''), then field/value pairs to set
-- Returns: {'ok', from, startedAt, pool, tenant, node, the layers a terminal move uncounted
--   (json: its layers and hibernation layer; '[]' otherwise), hibernationLayer before,
--   layerRefs counted ('1'|'0')}
--   | {'refused', currentState} | {'missing'}
local cur = redis.call('HMGET', KEYS[1], 'state', 'node', 'hibernationLayer', 'layerRefs', 'layerDigests', 'startedAt', 'pool', 'tenant')
local state = cur[1]
if not state then return {'missing'} end
if ARGV[4] ~= '' and cur[2] ~= ARGV[4] then return {'refused', state} end
local allowed = false
for s in string.gmatch(ARGV[2], '[^,]+') do if s == state then allowed = true end end
if not allowed then return {'refused', state} end
-- The answer's fields as the record holds them after the write: as read, or as set here.
local after = {node = cur[2], hibernationLayer = cur[3], startedAt = cur[6], pool = cur[7], tenant = cur[8]}
local fields = {'state', ARGV[1]}
for i = 5, #ARGV, 2 do
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
  if ARGV[i] == 'node' or ARGV[i] == 'hibernationLayer' or ARGV[i] == 'startedAt' or ARGV[i] == 'pool' or ARGV[i] == 'tenant' then after[ARGV[i]] = ARGV[i + 1] end
end
local counted = cur[4] == '1' and '1' or '0'
local uncount = '[]'
if ARGV[3] == '1' and counted == '1' then
  fields[#fields + 1] = 'layerRefs'
  fields[#fields + 1] = '0'
  local digests = cjson.decode(cur[5] or '[]')
  local hibernation = after.hibernationLayer or ''
  if hibernation ~= '' then digests[#digests + 1] = hibernation end
  if #digests > 0 then uncount = cjson.encode(digests) end
end
redis.call('HSET', KEYS[1], unpack(fields))
return {'ok', state, after.startedAt or '', after.pool or '', after.tenant or '', after.node or '', uncount, cur[3] or '', counted}
