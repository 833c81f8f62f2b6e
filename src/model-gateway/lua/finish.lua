-- A model call's record, made durable with the end of its answer (only by its owner).
-- KEYS[1] in-flight hash, KEYS[2] usage hash, KEYS[3] records hash, KEYS[4] log zset,
-- KEYS[5] the call's output stream
-- ARGV[1] callId, ARGV[2] owner token, ARGV[3] record JSON (an object without seq and
-- retriesJoined), ARGV[4] tokens it used, ARGV[5] record ttl s, ARGV[6] retry-join ttl s,
-- ARGV[7] now ms, ARGV[8] number of output entries, then per entry its field count and
-- its fields and values.
-- Answers {seq, retries joined}, or {'lost'} when another gateway took the call over.
if redis.call('HGET', KEYS[1], 'callId') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'owner') ~= ARGV[2] then
  return {'lost'}
end
local seq = redis.call('HINCRBY', KEYS[2], 'seq', 1)
redis.call('HINCRBY', KEYS[2], 'tokens', tonumber(ARGV[4]))
local joins = tonumber(redis.call('HGET', KEYS[1], 'joins') or '0')
redis.call('HSET', KEYS[3], ARGV[1], '{"seq":' .. seq .. ',"retriesJoined":' .. joins .. ',' .. string.sub(ARGV[3], 2))
redis.call('ZADD', KEYS[4], seq, ARGV[1])
local i = 9
for _ = 1, tonumber(ARGV[8]) do
  local n = tonumber(ARGV[i])
  local fields = {}
  for j = 1, n * 2 do fields[j] = ARGV[i + j] end
  i = i + n * 2 + 1
  redis.call('XADD', KEYS[5], '*', unpack(fields))
end
redis.call('HSET', KEYS[1], 'state', 'done', 'endedAt', ARGV[7])
for k = 2, 4 do redis.call('EXPIRE', KEYS[k], ARGV[5]) end
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('EXPIRE', KEYS[5], ARGV[6])
return {seq, joins}
