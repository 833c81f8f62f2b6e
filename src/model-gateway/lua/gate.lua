-- May a model call of a job go up now? Calls that are held wait in one line per job (by
-- arrival), across gateways; a call whose gateway stopped renewing its lease leaves it.
-- KEYS[1] hold state (hash: paused, down), KEYS[2] line (zset: callId by arrival ms),
-- KEYS[3] leases (zset: callId by lease end ms)
-- ARGV[1] callId, ARGV[2] arrival ms, ARGV[3] now ms, ARGV[4] lease end ms
-- Answers {answer, calls in line}: answer is 'go' (first in line: send the request, then
-- leave the line, so the next one is sent after it), 'probe' (first in line while the
-- upstreams are down: try them, leave once one answers), 'paused', 'queued' (others go
-- first), 'down' (the first in line probes the upstreams).
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[3])
for _, id in ipairs(dead) do
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
end
local paused = redis.call('HGET', KEYS[1], 'paused') == '1'
local down = redis.call('HGET', KEYS[1], 'down') == '1'
redis.call('ZADD', KEYS[2], 'NX', ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
local answer
if paused then
  answer = 'paused'
elseif redis.call('ZRANGE', KEYS[2], 0, 0)[1] ~= ARGV[1] then
  answer = down and 'down' or 'queued'
elseif down then
  answer = 'probe'
else
  answer = 'go'
end
return {answer, redis.call('ZCARD', KEYS[2])}
