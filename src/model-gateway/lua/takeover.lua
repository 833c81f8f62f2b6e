-- Another gateway runs a call whose owner stopped renewing its lease (it died).
-- KEYS[1] in-flight hash; ARGV[1] callId, ARGV[2] new owner token, ARGV[3] now ms, ARGV[4] lease ms
-- Answers 1 when taken over here, 0 when the call ended, changed or its owner is alive.
local cur = redis.call('HMGET', KEYS[1], 'callId', 'state', 'leaseUntil')
if cur[1] ~= ARGV[1] or cur[2] ~= 'running' or tonumber(cur[3]) >= tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'leaseUntil', tonumber(ARGV[3]) + tonumber(ARGV[4]))
redis.call('HINCRBY', KEYS[1], 'takeovers', 1)
return 1
