-- The owner of a running model call renews its lease.
-- KEYS[1] in-flight hash; ARGV[1] callId, ARGV[2] owner token, ARGV[3] lease end ms
-- Answers 1, or 0 when the call is no longer this owner's (another gateway took it over).
local cur = redis.call('HMGET', KEYS[1], 'callId', 'owner', 'state')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] or cur[3] ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'leaseUntil', ARGV[3])
return 1
