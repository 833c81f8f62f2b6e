-- Counts a live sandbox recorded before layer reference counts existed (once, by the key
-- migration, src/registry/migrate.ts): its layers and hibernation layer, as a create and
-- a hibernation would have. Idempotent by the record's `layerRefs` flag.
-- KEYS: sandbox, layerRefs   Returns 1 if it was counted now.
local state = redis.call('HGET', KEYS[1], 'state')
if not state or state == 'terminated' or state == 'failed' then return 0 end
if redis.call('HGET', KEYS[1], 'layerRefs') then return 0 end
for _, digest in ipairs(cjson.decode(redis.call('HGET', KEYS[1], 'layerDigests') or '[]')) do redis.call('HINCRBY', KEYS[2], digest, 1) end
local hibernation = redis.call('HGET', KEYS[1], 'hibernationLayer') or ''
if hibernation ~= '' then redis.call('HINCRBY', KEYS[2], hibernation, 1) end
redis.call('HSET', KEYS[1], 'layerRefs', '1')
return 1
