-- KEYS: signalBucket
-- ARGV: field, value, ttlSeconds
-- Returns: 1 if the field rose to value, 0 if it already held as much.
-- A maximum kept across gateways (each gateway raises it with what it saw).
local current = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '-1')
local raised = 0
if tonumber(ARGV[2]) > current then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  raised = 1
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
return raised
