-- Its outcome cannot be known (its host died or restarted while it ran): recorded, and the
-- gateway waiting on it told at once. KEYS: command   ARGV: endedAt, replyChannelPrefix, message
local cur = redis.call('HMGET', KEYS[1], 'state', 'replyTo', 'requestId')
if cur[1] ~= 'queued' and cur[1] ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'unknown', 'endedAt', ARGV[1])
-- A queued one still holds its op (and maybe its env): it will not be sent again.
redis.call('HDEL', KEYS[1], 'op')
if cur[2] and cur[3] then
  redis.call('PUBLISH', ARGV[2] .. cur[2], cjson.encode({kind = 'error', requestId = cur[3], error = {code = 'result_unknown', message = ARGV[3]}}))
end
return 1
