import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll } from 'vitest';
import { connectRedis, startRedisServer, type RedisServerHandle } from '../../src/redis/index.ts';

/**
 * A private redis-server (no persistence, loopback, a free port) and a connection to it for
 * the tests of one file: started before them, stopped and its directory removed after.
 * For tests of one Redis-backed module without a whole stack (startTestCluster).
 */
export function useScratchRedis(name: string): { readonly redis: Redis; readonly url: string } {
  let dir: string | undefined;
  let server: RedisServerHandle | undefined;
  let redis: Redis | undefined;
  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), `rollbox-${name}-`));
    server = await startRedisServer({ dataDir: path.join(dir, 'redis'), persist: false });
    redis = connectRedis(server.url);
  });
  afterAll(async () => {
    await redis?.quit();
    await server?.stop();
    if (dir) await rm(dir, { recursive: true, force: true });
  });
  return {
    get redis() {
      if (!redis) throw new Error('useScratchRedis: the Redis is there only inside the tests');
      return redis;
    },
    get url() {
      if (!server) throw new Error('useScratchRedis: the Redis is there only inside the tests');
      return server.url;
    },
  };
}
