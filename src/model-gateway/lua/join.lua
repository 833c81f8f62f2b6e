-- A model call arrives: join the call in flight with the same body (a client's retry), or
-- start a new one (a new turn), within the rollout's limits.
-- KEYS[1] in-flight hash of this body, KEYS[2] turn counter, KEYS[3] usage hash
-- ARGV[1] new callId, ARGV[2] owner token, ARGV[3] now ms, ARGV[4] lease ms,
-- ARGV[5] '1' when the client says it retries (x-stainless-retry-count > 0), ARGV[6] ttl s
-- Answers {'new', callId, turn, receivedAt}, {'join', callId, turn, receivedAt},
-- {'takeover', callId, turn, receivedAt} (its gateway stopped renewing: run it here),
-- {'limit', which}.
local now = tonumber(ARGV[3])
local cur = redis.call('HMGET', KEYS[1], 'callId', 'state', 'leaseUntil', 'turn', 'receivedAt')
if cur[1] and (cur[2] == 'running' or ARGV[5] == '1') then
  redis.call('HINCRBY', KEYS[1], 'joins', 1)
  if cur[2] == 'running' and tonumber(cur[3]) < now then
    redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'leaseUntil', now + tonumber(ARGV[4]))
    redis.call('HINCRBY', KEYS[1], 'takeovers', 1)
    return {'takeover', cur[1], cur[4], cur[5]}
  end
  return {'join', cur[1], cur[4], cur[5]}
end
local u = redis.call('HMGET', KEYS[3], 'deadlineMs', 'maxModelCalls', 'calls', 'maxTokens', 'tokens')
local hit = nil
if u[1] and tonumber(u[1]) <= now then hit = 'wall_time'
elseif u[2] and tonumber(u[3] or '0') >= tonumber(u[2]) then hit = 'max_model_calls'
elseif u[4] and tonumber(u[5] or '0') >= tonumber(u[4]) then hit = 'max_tokens' end
if hit then
  redis.call('HSETNX', KEYS[3], 'hit', hit)
  return {'limit', hit}
end
redis.call('HINCRBY', KEYS[3], 'calls', 1)
redis.call('EXPIRE', KEYS[3], ARGV[6])
local turn = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[6])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'callId', ARGV[1], 'owner', ARGV[2], 'leaseUntil', now + tonumber(ARGV[4]), 'turn', turn, 'state', 'running', 'receivedAt', now, 'joins', 0)
redis.call('EXPIRE', KEYS[1], ARGV[6])
return {'new', ARGV[1], turn, now}
