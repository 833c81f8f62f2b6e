import type { Redis } from 'ioredis';
import { LuaScript, keys } from '../../registry/index.ts';

/** Renew the lock if we hold it, take it if free. KEYS: lock  ARGV: holder, ttlMs */
const HOLD = new LuaScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0`);

/** Write only while holding the lock. KEYS: lock, key  ARGV: holder, value */
const SET_IF_HOLDER = new LuaScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[2], ARGV[2]) return 1 end
return 0`);

/** KEYS: lock  ARGV: holder */
const RELEASE = new LuaScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`);

/**
 * The burst controller's leadership: one gateway at a time holds a Redis lock, renewed
 * each tick; what the leader writes is fenced by it, so a leader that lost the lock in a
 * slow tick cannot overwrite its successor.
 */
export class LeaderLease {
  private readonly lock = keys.lock('burst-controller');

  constructor(
    private readonly redis: Redis,
    private readonly holder: string,
  ) {}

  async hold(ttlMs: number): Promise<boolean> {
    return (await HOLD.run(this.redis, [this.lock], [this.holder, ttlMs])) === 1;
  }

  async setIfLeader(key: string, value: string): Promise<boolean> {
    return (await SET_IF_HOLDER.run(this.redis, [this.lock, key], [this.holder, value])) === 1;
  }

  async release(): Promise<void> {
    await RELEASE.run(this.redis, [this.lock], [this.holder]);
  }
}
