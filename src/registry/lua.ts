import { createHash } from 'node:crypto';
import type { Redis } from 'ioredis';

/**
 * Lua scripts: each sandbox state change is one atomic script so that concurrent
 * gateways and workers can never move a state backwards or end it twice.
 */

/**
 * KEYS: sandbox, tenantLive, tenantAll, idempotency (or ''), nodeSandboxes (or ''), unsettled
 * ARGV: id, tenant, maxLive, createdAtMs, idemValue (or ''), unsettledDeadlineMs, idemTtlSec, then field/value pairs
 * Returns: {'created'} | {'exists', value} | {'quota', liveCount}
 */
export const ADMIT_SANDBOX = `
if KEYS[4] ~= '' then
  local existing = redis.call('GET', KEYS[4])
  if existing then return {'exists', existing} end
end
local live = redis.call('SCARD', KEYS[2])
if live >= tonumber(ARGV[3]) then return {'quota', tostring(live)} end
if KEYS[4] ~= '' then redis.call('SET', KEYS[4], ARGV[5], 'EX', tonumber(ARGV[7])) end
local fields = {}
for i = 8, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], tonumber(ARGV[4]), ARGV[1])
if KEYS[5] ~= '' then redis.call('SADD', KEYS[5], ARGV[1]) end
redis.call('ZADD', KEYS[6], tonumber(ARGV[6]), ARGV[1])
return {'created'}
`;

/**
 * KEYS: sandbox, unsettled
 * ARGV: to, allowedFrom (comma list), terminal ('1'|'0'), tenantLivePrefix, nodeSandboxesPrefix,
 *       expectedNode (or ''), then field/value pairs to set
 * Returns: {'ok', from} | {'refused', currentState} | {'missing'}
 */
export const TRANSITION = `
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {'missing'} end
if ARGV[6] ~= '' and redis.call('HGET', KEYS[1], 'node') ~= ARGV[6] then return {'refused', state} end
local allowed = false
for s in string.gmatch(ARGV[2], '[^,]+') do if s == state then allowed = true end end
if not allowed then return {'refused', state} end
local fields = {'state', ARGV[1]}
for i = 7, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
if ARGV[1] ~= 'pending' and ARGV[1] ~= 'creating' then redis.call('ZREM', KEYS[2], redis.call('HGET', KEYS[1], 'id')) end
if ARGV[3] == '1' then
  local tenant = redis.call('HGET', KEYS[1], 'tenant')
  local node = redis.call('HGET', KEYS[1], 'node')
  local id = redis.call('HGET', KEYS[1], 'id')
  redis.call('SREM', ARGV[4] .. tenant .. ':live', id)
  if node then redis.call('SREM', ARGV[5] .. node .. ':sbx', id) end
end
return {'ok', state}
`;

/**
 * Moves a sandbox that runs nowhere (pending, or hibernated) to another node.
 * KEYS: sandbox, oldNodeSandboxes, newNodeSandboxes   ARGV: id, newNode
 * Returns 1 if moved, 0 if the sandbox is no longer pending.
 */
export const REASSIGN = `
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'pending' and state ~= 'hibernated' then return 0 end
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[1], 'node', ARGV[2])
return 1
`;

/**
 * Compare-and-set of a sandbox's spec: only over the spec that was read, and only while
 * the sandbox is in one of the given states (none given: any state).
 * KEYS: sandbox. ARGV: specRead, newSpec, allowed states...
 * Returns: 'ok' | 'changed' (retry) | 'state' (not in an allowed state, or gone).
 */
export const SET_SPEC = `
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
`;

/**
 * A Lua script sent once per connection and then called by its SHA (EVALSHA): the body
 * does not travel with every call. Falls back to EVAL when the server does not know it
 * (a restarted Redis).
 */
export class LuaScript {
  readonly sha: string;

  constructor(readonly body: string) {
    this.sha = createHash('sha1').update(body).digest('hex');
  }

  async run(redis: Redis, keys: readonly string[], args: readonly (string | number | Buffer)[]): Promise<unknown> {
    try {
      return await redis.evalsha(this.sha, keys.length, ...keys, ...args);
    } catch (err) {
      if (!String((err as Error).message).startsWith('NOSCRIPT')) throw err;
      return redis.eval(this.body, keys.length, ...keys, ...args);
    }
  }
}
