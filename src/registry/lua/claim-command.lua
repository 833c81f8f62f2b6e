-- Looks the sandbox up and records a new command, in one step on the sandbox's keys (one
-- cluster slot). The caller then puts the op in the inbox of the node this answers (the
-- node's slot): until the command starts, the record keeps the op, so a re-sent commandId
-- finding it still queued sends it again (the worker starts a command once, and the start
-- takes the op out of the record: it may hold the command's env).
-- KEYS: sandbox, command, sandboxLog   ARGV: tenant, ttl, queuedAtMs, commandRef, op json,
--   then record fields (the node is added here)
-- Returns {'claimed', node} | {'exists', state, node, op or ''} (the commandId was used
--   before in this sandbox) | {'missing'} (no such sandbox of this tenant) | {'state', state, failureReason}.
local sb = redis.call('HMGET', KEYS[1], 'tenant', 'state', 'node', 'failureReason')
if sb[1] ~= ARGV[1] then return {'missing'} end
local cmd = redis.call('HMGET', KEYS[2], 'state', 'node', 'op')
if cmd[1] then return {'exists', cmd[1], cmd[2] or '', cmd[3] or ''} end
if sb[2] ~= 'running' or not sb[3] then return {'state', sb[2], sb[4] or ''} end
redis.call('HSET', KEYS[2], 'node', sb[3], 'op', ARGV[5], unpack(ARGV, 6))
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2]))
redis.call('ZADD', KEYS[3], tonumber(ARGV[3]), ARGV[4])
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[2]))
return {'claimed', sb[3]}
