import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Queue, Worker } from 'bullmq';
import { JOB_KEY_PREFIX, connectJobRedis, jobQueueName } from '../src/queues/jobs/index.ts';
import { LuaScript, connectRedis, startRedisCluster, waitForRedis, type RedisClusterHandle } from '../src/redis/index.ts';

// A real three-primary, three-replica Redis Cluster on loopback, and rollbox's own
// connection (connectRedis with a redis+cluster:// URL) against it.
let dir: string;
let cluster: RedisClusterHandle;
let redis: Redis;
const extra: Redis[] = [];
let pids: number[] = [];

const isAlive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};
const connect = (): Redis => {
  const c = connectRedis(cluster.url);
  extra.push(c);
  return c;
};
const slotOf = async (key: string): Promise<number> => Number(await redis.call('CLUSTER', 'KEYSLOT', key));

beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-redis-cluster-'));
  cluster = await startRedisCluster({ dataDir: path.join(dir, 'cluster') });
  pids = (await cluster.nodes()).map((n) => n.pid);
  redis = connectRedis(cluster.url);
});
afterAll(async () => {
  for (const c of [redis, ...extra]) c?.disconnect();
  await cluster?.stop();
  await fs.rm(dir, { recursive: true, force: true });
});

describe('Redis Cluster: startRedisCluster and connectRedis(redis+cluster://)', () => {
  it('starts three primaries with a replica each, all slots served; waitForRedis accepts it', async () => {
    expect(cluster.url).toMatch(/^redis\+cluster:\/\/127\.0\.0\.1:\d+(,127\.0\.0\.1:\d+){5}$/);
    const nodes = await cluster.nodes();
    const primaries = nodes.filter((n) => n.role === 'primary');
    expect(primaries).toHaveLength(3);
    expect(nodes.filter((n) => n.role === 'replica').map((n) => n.primaryPort).sort()).toEqual(primaries.map((n) => n.port).sort());
    expect(primaries.flatMap((n) => n.slots!).reduce((sum, [a, b]) => sum + b - a + 1, 0)).toBe(16_384);
    // The URL lists the primaries first.
    expect(cluster.url.split('//')[1]!.split(',').slice(0, 3).map((h) => Number(h.split(':')[1]))).toEqual(primaries.map((n) => n.port));
    const silent = { warn() {}, info() {} } as never;
    await waitForRedis(cluster.url, { logger: silent, what: 'test' });
  });

  it('sets and gets keys that live on different primaries', async () => {
    const keys = Array.from({ length: 12 }, (_, i) => `k${i}`);
    await Promise.all(keys.map((k, i) => redis.set(k, `v${i}`)));
    expect(await Promise.all(keys.map((k) => redis.get(k)))).toEqual(keys.map((_, i) => `v${i}`));
    const owners = new Set<number>();
    const primaries = (await cluster.nodes()).filter((n) => n.role === 'primary');
    for (const k of keys) {
      const slot = await slotOf(k);
      owners.add(primaries.find((n) => n.slots!.some(([a, b]) => slot >= a && slot <= b))!.port);
    }
    expect(owners.size).toBe(3);
  });

  it('runs a LuaScript on keys that share a hash tag (EVALSHA after the NOSCRIPT fallback)', async () => {
    const moduleDir = path.join(dir, 'module');
    await fs.mkdir(path.join(moduleDir, 'lua'), { recursive: true });
    await fs.writeFile(path.join(moduleDir, 'lua', 'move.lua'), "redis.call('SET', KEYS[2], ARGV[1]); return redis.call('INCRBY', KEYS[1], ARGV[2])\n");
    const script = new LuaScript(moduleDir, 'move');
    expect(await script.run(redis, ['{sbx:1}:n', '{sbx:1}:v'], ['a', 2])).toBe(2);
    expect(await script.run(redis, ['{sbx:1}:n', '{sbx:1}:v'], ['b', 3])).toBe(5);
    expect(await redis.get('{sbx:1}:v')).toBe('b');
    // Keys of different slots in one script are refused before they are sent (LuaScript checks their hash tags).
    await expect(script.run(redis, ['{a}n', '{b}v'], ['c', 1])).rejects.toThrow(/different Redis Cluster slots/);
  });

  it('PUBLISH on one connection reaches SUBSCRIBE on another', async () => {
    const sub = connect();
    const got = new Promise<string>((resolve) => sub.on('message', (_channel: string, message: string) => resolve(message)));
    await sub.subscribe('rb:test:events');
    // Delivered through the cluster bus to whichever node the subscriber is on.
    expect(await redis.publish('rb:test:events', 'hello')).toBeGreaterThanOrEqual(0);
    expect(await got).toBe('hello');
  });

  it('a BLMOVE on its own connection returns when another connection LPUSHes', async () => {
    const blocking = connect();
    const started = Date.now();
    const moved = blocking.blmove('{q:1}:src', '{q:1}:dst', 'RIGHT', 'LEFT', 10);
    await new Promise((r) => setTimeout(r, 200));
    await redis.lpush('{q:1}:src', 'job-1');
    expect(await moved).toBe('job-1');
    expect(Date.now() - started).toBeLessThan(5000);
    expect(await redis.lrange('{q:1}:dst', 0, -1)).toEqual(['job-1']);
  });

  it('BullMQ runs a job of a hash-tagged queue over connectJobRedis', async () => {
    const connection = connectJobRedis(cluster.url);
    extra.push(connection);
    const name = jobQueueName('create', 'node-1');
    const queue = new Queue(name, { connection, prefix: JOB_KEY_PREFIX });
    let worker: Worker | undefined;
    try {
      const done = new Promise<unknown>((resolve, reject) => {
        worker = new Worker(name, async (job) => ({ echoed: job.data }), { connection, prefix: JOB_KEY_PREFIX });
        worker.on('completed', (_job, result) => resolve(result));
        worker.on('failed', (_job, err) => reject(err));
      });
      await queue.add('create', { sandbox: 'sbx_1' });
      expect(await done).toEqual({ echoed: { sandbox: 'sbx_1' } });
    } finally {
      await worker?.close();
      await queue.close();
    }
  });

  it('a killed primary is replaced by its replica and an acknowledged write survives, through the same client', async () => {
    const key = '{failover}:k';
    // WAIT has no key: in a pipeline with the write it goes to the same primary.
    const results = (await redis.pipeline().set(key, 'kept').call('WAIT', 1, 1000).exec())!;
    const [setErr] = results[0]!;
    const [waitErr, acked] = results[1]!;
    expect(setErr).toBeNull();
    expect(waitErr).toBeNull();
    expect(acked).toBe(1);
    const slot = await slotOf(key);
    const before = await cluster.nodes();
    const owner = before.find((n) => n.role === 'primary' && n.slots!.some(([a, b]) => slot >= a && slot <= b))!;
    const replica = before.find((n) => n.primaryPort === owner.port)!;
    const killedAt = Date.now();
    await cluster.kill(owner.port);
    expect(isAlive(owner.pid)).toBe(false);
    // Asked before the takeover: connectRedis's retry budget (about 15 s) waits it out.
    const during = redis.get(key);
    for (;;) {
      const now = await cluster.nodes();
      if (now.find((n) => n.port === replica.port)?.role === 'primary') break;
      expect(Date.now() - killedAt).toBeLessThan(15_000);
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(await during).toBe('kept');
    expect(await redis.get(key)).toBe('kept');
    // And writes to that slot go to the new primary.
    await redis.set(key, 'after');
    expect(await redis.get(key)).toBe('after');
  });

  it('stop() ends every redis-server it started, and is safe twice', async () => {
    expect(pids).toHaveLength(6);
    for (const c of [redis, ...extra]) c.disconnect();
    await cluster.stop();
    await cluster.stop();
    expect(pids.filter(isAlive)).toEqual([]);
  });
});
