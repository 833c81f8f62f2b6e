import type { Redis } from 'ioredis';
import { LuaScript } from '../../redis/index.ts';
import { keys } from '../../registry/index.ts';

const HOLD = new LuaScript(import.meta.dirname, 'lease-hold');

const SET_IF_HOLDER = new LuaScript(import.meta.dirname, 'lease-set-if-holder');

const RELEASE = new LuaScript(import.meta.dirname, 'lease-release');

/**
 * The burst controller's leadership: one gateway at a time holds a Redis lock, renewed
 * each tick; what the leader writes is fenced by it, so a leader that lost the lock in a
 * slow tick cannot overwrite its successor.
 */
export class LeaderLease {
  private readonly lock = keys.burstLeader;

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
