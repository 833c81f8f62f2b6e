-- The command's result, its inbox message acknowledged, its gateway told, in one step.
-- KEYS: command, taken (or '')   ARGV: endedAt, result json, taken message (or ''), reply channel, reply json
-- Never overwrites a settled command (one reported unknown stays unknown). Returns 1 if settled now.
if KEYS[2] ~= '' then redis.call('LREM', KEYS[2], 1, ARGV[3]) end
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'queued' and state ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'done', 'endedAt', ARGV[1], 'result', ARGV[2])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
