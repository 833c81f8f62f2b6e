-- Moves a sandbox that runs nowhere (pending, or hibernated) to another node; with ARGV[3]
-- '1', also one still `creating` on the old node (its gateway saw that node stop
-- heartbeating before the sandbox ran): it goes back to pending on the new node, and the
-- old node, should it come back, finds the sandbox no longer its own and drops its work.
-- The record alone (one slot); the caller moves it between the nodes' sets.
-- KEYS: sandbox   ARGV: newNode, fromCreating, oldNode
-- Returns 1 if moved, 0 if the sandbox is in no state that may move.
local state = redis.call('HGET', KEYS[1], 'state')
local fromCreating = ARGV[2] == '1' and state == 'creating' and redis.call('HGET', KEYS[1], 'node') == ARGV[3]
if state ~= 'pending' and state ~= 'hibernated' and not fromCreating then return 0 end
redis.call('HSET', KEYS[1], 'node', ARGV[1])
if fromCreating then redis.call('HSET', KEYS[1], 'state', 'pending') end
return 1
