-- KEYS: sandbox, tenantLive, tenantAll, idempotency (or ''), nodeSandboxes (or ''), unsettled, layerRefs
-- ARGV: id, tenant, maxLive, createdAtMs, idemValue (or ''), unsettledDeadlineMs, idemTtlSec, then field/value pairs
-- Returns: {'created'} | {'exists', value} | {'quota', liveCount}
if KEYS[4] ~= '' then
  local existing = redis.call('GET', KEYS[4])
  if existing then return {'exists', existing} end
end
local live = redis.call('SCARD', KEYS[2])
if live >= tonumber(ARGV[3]) then return {'quota', tostring(live)} end
if KEYS[4] ~= '' then redis.call('SET', KEYS[4], ARGV[5], 'EX', tonumber(ARGV[7])) end
local fields = {}
for i = 8, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], tonumber(ARGV[4]), ARGV[1])
if KEYS[5] ~= '' then redis.call('SADD', KEYS[5], ARGV[1]) end
redis.call('ZADD', KEYS[6], tonumber(ARGV[6]), ARGV[1])
-- Its layers are referenced while it lives (layer garbage collection reads the counts).
for _, digest in ipairs(cjson.decode(redis.call('HGET', KEYS[1], 'layerDigests') or '[]')) do redis.call('HINCRBY', KEYS[7], digest, 1) end
redis.call('HSET', KEYS[1], 'layerRefs', '1')
return {'created'}
