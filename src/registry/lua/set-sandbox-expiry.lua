-- A live sandbox's new end of life (expiresAt, ISO 8601). Returns 1, or 0 when the
-- sandbox is gone or has ended (a TTL never brings an ended sandbox back).
-- KEYS[1] sandbox hash; ARGV[1] expiresAt
local state = redis.call('HGET', KEYS[1], 'state')
if not state or state == 'terminated' or state == 'failed' or state == 'stopping' then return 0 end
redis.call('HSET', KEYS[1], 'expiresAt', ARGV[1])
return 1
