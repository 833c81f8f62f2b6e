import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { PoolRecord } from '../api/index.ts';
import { LuaScript } from '../redis/index.ts';
import { keys } from './keys.ts';

const CLAIM = new LuaScript(import.meta.dirname, 'pool-claim');
const PUSH = new LuaScript(import.meta.dirname, 'pool-push');
const EVENTS_WINDOW_MS = 60_000;

/**
 * Warm pools in Redis: their definitions, each worker host's list of ready sandboxes per
 * pool version, and the claims and misses of the last minute. Taking a ready sandbox is
 * one atomic pop, so gateways racing for the last one get different answers.
 */
export class PoolRegistry {
  constructor(
    private readonly redis: Redis,
    private readonly now: () => number = Date.now,
  ) {}

  async put(record: PoolRecord): Promise<void> {
    // Named before it is defined: a name without a definition is listed as nothing.
    await this.redis.sadd(keys.pools, record.name);
    await this.redis.set(keys.pool(record.name), JSON.stringify(record));
  }

  async get(name: string): Promise<PoolRecord | undefined> {
    const raw = await this.redis.get(keys.pool(name));
    return raw ? PoolRecord.parse(JSON.parse(raw)) : undefined;
  }

  async list(): Promise<PoolRecord[]> {
    const names = await this.redis.smembers(keys.pools);
    // One read per pool (each its own cluster slot), sent together by auto-pipelining.
    const records = await Promise.all(names.map((name) => this.get(name)));
    return records.filter((r): r is PoolRecord => r !== undefined).sort((a, b) => a.name.localeCompare(b.name));
  }

  /** Removes the definition and every host's ready list: nothing of it can be claimed after. */
  async delete(name: string): Promise<boolean> {
    // The definition first: no host can offer into the pool once it is gone.
    const removed = await this.redis.del(keys.pool(name));
    await this.redis.srem(keys.pools, name);
    await this.redis.del(...(await this.redis.smembers(keys.poolReadyLists(name))), keys.poolReadyLists(name), keys.poolEvents(name));
    return removed > 0;
  }

  /** One ready sandbox of the pool on `nodeId`, or undefined (recorded as a miss when `countMiss`). */
  async claim(pool: Pick<PoolRecord, 'name' | 'version'>, nodeId: string, countMiss: boolean): Promise<string | undefined> {
    const id = await CLAIM.run(this.redis, [keys.poolReady(pool.name, pool.version, nodeId), keys.poolEvents(pool.name)], [this.now(), randomBytes(8).toString('hex'), countMiss ? '1' : '0']);
    return typeof id === 'string' ? id : undefined;
  }

  /** A miss seen without trying a host (no host had a ready sandbox). */
  async recordMiss(name: string): Promise<void> {
    const now = this.now();
    await this.redis.zadd(keys.poolEvents(name), now, `m:${randomBytes(8).toString('hex')}`);
    await this.redis.zremrangebyscore(keys.poolEvents(name), '-inf', now - EVENTS_WINDOW_MS);
  }

  async lastMinute(name: string): Promise<{ claims: number; misses: number }> {
    const events = await this.redis.zrangebyscore(keys.poolEvents(name), this.now() - EVENTS_WINDOW_MS, '+inf');
    const claims = events.filter((e) => e.startsWith('c:')).length;
    return { claims, misses: events.length - claims };
  }

  /** A worker host offers a ready sandbox; false when the pool is gone or has changed. */
  async offer(pool: Pick<PoolRecord, 'name' | 'version'>, nodeId: string, sandboxId: string): Promise<boolean> {
    return (await PUSH.run(this.redis, [keys.pool(pool.name), keys.poolReady(pool.name, pool.version, nodeId), keys.poolReadyLists(pool.name)], [pool.version, sandboxId])) === 1;
  }

  /** Takes a ready sandbox back off its list; false when a gateway claimed it first. */
  async withdraw(pool: Pick<PoolRecord, 'name' | 'version'>, nodeId: string, sandboxId: string): Promise<boolean> {
    return (await this.redis.lrem(keys.poolReady(pool.name, pool.version, nodeId), 1, sandboxId)) > 0;
  }

  /** The ids on a host's ready list. */
  async ready(pool: Pick<PoolRecord, 'name' | 'version'>, nodeId: string): Promise<string[]> {
    return this.redis.lrange(keys.poolReady(pool.name, pool.version, nodeId), 0, -1);
  }

  /**
   * Every ready list of a host, of any pool or version (worker start): key -> ids. Read
   * from each pool's set of its lists: no key scan (a cluster has none across its shards).
   */
  async readyListsOf(nodeId: string): Promise<Map<string, { pool: string; version: string; ids: string[] }>> {
    const out = new Map<string, { pool: string; version: string; ids: string[] }>();
    for (const pool of await this.redis.smembers(keys.pools)) {
      for (const key of await this.redis.smembers(keys.poolReadyLists(pool))) {
        const versionAndNode = key.slice(keys.poolReady(pool, '', '').length - 1);
        const at = versionAndNode.indexOf(':');
        if (versionAndNode.slice(at + 1) === nodeId) out.set(key, { pool, version: versionAndNode.slice(0, at), ids: await this.redis.lrange(key, 0, -1) });
      }
    }
    return out;
  }

  async dropList(pool: string, key: string): Promise<void> {
    await this.redis.del(key);
    await this.redis.srem(keys.poolReadyLists(pool), key);
  }
}
