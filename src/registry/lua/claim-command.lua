-- Looks the sandbox up and records a new command, in one step on the sandbox's keys (one
-- cluster slot). The caller then puts the op in the inbox of the node this answers (the
-- node's slot): until it has, a copy of the op waits beside the command, so a re-sent
-- commandId finding it still queued sends it again (the worker starts a command once).
-- KEYS: sandbox, command, sandboxLog, opCopy   ARGV: tenant, ttl, queuedAtMs, commandRef,
--   op json, opCopyTtl, then record fields (the node is added here)
-- Returns {'claimed', node} | {'exists', state, node, op copy or ''} (the commandId was used
--   before in this sandbox) | {'missing'} (no such sandbox of this tenant) | {'state', state, failureReason}.
local sb = redis.call('HMGET', KEYS[1], 'tenant', 'state', 'node', 'failureReason')
if sb[1] ~= ARGV[1] then return {'missing'} end
if redis.call('EXISTS', KEYS[2]) == 1 then
  local cmd = redis.call('HMGET', KEYS[2], 'state', 'node')
  return {'exists', cmd[1] or '', cmd[2] or '', redis.call('GET', KEYS[4]) or ''}
end
if sb[2] ~= 'running' or not sb[3] then return {'state', sb[2], sb[4] or ''} end
redis.call('HSET', KEYS[2], 'node', sb[3], unpack(ARGV, 7))
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2]))
redis.call('ZADD', KEYS[3], tonumber(ARGV[3]), ARGV[4])
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[2]))
redis.call('SET', KEYS[4], ARGV[5], 'EX', tonumber(ARGV[6]))
return {'claimed', sb[3]}
