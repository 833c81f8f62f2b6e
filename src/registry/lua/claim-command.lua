-- Looks the sandbox up, records a new command and puts its operation in the inbox of the
-- sandbox's node, in one step: a command is never recorded without being sent, and the
-- gateway's exec costs one round trip to Redis before the command runs.
-- KEYS: sandbox, command, sandboxLog   ARGV: tenant, inboxPrefix, inboxSuffix, ttl, queuedAtMs,
--   commandRef, op json, then record fields (the node is added here)
-- Returns {'claimed', node} | {'exists'} (the commandId was used before in this sandbox) |
--   {'missing'} (no such sandbox of this tenant) | {'state', state, failureReason}.
local sb = redis.call('HMGET', KEYS[1], 'tenant', 'state', 'node', 'failureReason')
if sb[1] ~= ARGV[1] then return {'missing'} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {'exists'} end
if sb[2] ~= 'running' or not sb[3] then return {'state', sb[2], sb[4] or ''} end
redis.call('HSET', KEYS[2], 'node', sb[3], unpack(ARGV, 8))
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[4]))
redis.call('ZADD', KEYS[3], tonumber(ARGV[5]), ARGV[6])
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[4]))
redis.call('LPUSH', ARGV[2] .. sb[3] .. ARGV[3], ARGV[7])
return {'claimed', sb[3]}
