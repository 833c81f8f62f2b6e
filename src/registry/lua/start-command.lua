-- KEYS: command   ARGV: requestId, startedAt. Only the request that queued it may start it, once.
local cur = redis.call('HMGET', KEYS[1], 'state', 'requestId')
if cur[1] ~= 'queued' or cur[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'running', 'startedAt', ARGV[2])
return 1
