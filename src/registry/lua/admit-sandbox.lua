-- A tenant's side of a new sandbox: its Idempotency-Key, its quota and its listing, in one
-- step (one slot: `{tenant:T}`). The sandbox record follows (record-sandbox).
-- KEYS: tenantLive, tenantAll, then the idempotency key if the request has one
-- ARGV: id, maxLive, createdAtMs, idemValue (or ''), idemTtlSec
-- Returns: {'admitted'} | {'exists', value} | {'quota', liveCount}
if KEYS[3] then
  local existing = redis.call('GET', KEYS[3])
  if existing then return {'exists', existing} end
end
local live = redis.call('SCARD', KEYS[1])
if live >= tonumber(ARGV[2]) then return {'quota', tostring(live)} end
if KEYS[3] then redis.call('SET', KEYS[3], ARGV[4], 'EX', tonumber(ARGV[5])) end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], tonumber(ARGV[3]), ARGV[1])
return {'admitted'}
