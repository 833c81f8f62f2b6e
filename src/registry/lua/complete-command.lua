-- The command's result, its gateway told, in one step on the command's key (the inbox
-- message is acknowledged after, in the node's slot: see CommandLog.complete).
-- KEYS: command   ARGV: endedAt, result json, reply channel, reply json
-- Never overwrites a settled command (one reported unknown stays unknown). Returns 1 if settled now.
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'queued' and state ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'done', 'endedAt', ARGV[1], 'result', ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
