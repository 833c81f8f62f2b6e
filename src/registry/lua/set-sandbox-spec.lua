-- Compare-and-set of a sandbox's spec: only over the spec that was read, and only while
-- the sandbox is in one of the given states (none given: any state).
-- KEYS: sandbox. ARGV: specRead, newSpec, allowed states...
-- Returns: 'ok' | 'changed' (retry) | 'state' (not in an allowed state, or gone).
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 'state' end
if #ARGV > 2 then
  local allowed = false
  for i = 3, #ARGV do if ARGV[i] == state then allowed = true end end
  if not allowed then return 'state' end
end
if redis.call('HGET', KEYS[1], 'spec') ~= ARGV[1] then return 'changed' end
redis.call('HSET', KEYS[1], 'spec', ARGV[2])
return 'ok'
