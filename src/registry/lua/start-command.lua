-- KEYS: command   ARGV: requestId, startedAt. Only the request that queued it may start it, once.
-- The op its claim kept for a re-send goes: it is no longer needed, and may hold the command's env.
local cur = redis.call('HMGET', KEYS[1], 'state', 'requestId')
if cur[1] ~= 'queued' or cur[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'running', 'startedAt', ARGV[2])
redis.call('HDEL', KEYS[1], 'op')
return 1
