-- Moves a sandbox that runs nowhere (pending, or hibernated) to another node.
-- KEYS: sandbox, oldNodeSandboxes, newNodeSandboxes   ARGV: id, newNode
-- Returns 1 if moved, 0 if the sandbox is no longer pending.
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'pending' and state ~= 'hibernated' then return 0 end
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[1], 'node', ARGV[2])
return 1
