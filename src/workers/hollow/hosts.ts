import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { Config } from '../../config/index.ts';
import { connectJobRedis } from '../../queues/jobs/index.ts';
import { connectRedis } from '../../redis/index.ts';
import { CommandLog, SandboxRegistry } from '../../registry/index.ts';
import { WorkerHost } from '../host.ts';
import { refuseOutsideBenchmarks } from './guard.ts';
import { HollowRuntime } from './runtime.ts';

/** The pool hollow hosts heartbeat in: a gateway places there only when its own pool is set to it (a benchmark's). */
export const HOLLOW_POOL = 'hollow';

export interface HollowHostsOptions {
  count: number;
  redisUrl: string;
  /** The node part of a config (heartbeat, lost-after, audit, ...); capacity and pool are set below. */
  config: Config['node'];
  /** What each host promises: the limits its real admission holds it to. */
  capacity: { memoryMiB: number; cpuMillis: number; maxSandboxes: number; maxStarting: number };
  logger: Logger;
  /** Node ids are `hollow-<prefix><n>`; a second process of hosts needs another prefix. */
  idPrefix?: string;
}

export interface HollowHosts {
  nodeIds: string[];
  /** The sandboxes each host holds now, by node id (from their runtimes, not from Redis). */
  sandboxesByNode(): Map<string, string[]>;
  stop(): Promise<void>;
}

/**
 * `count` real worker hosts (WorkerHost: heartbeats, admission, ops inbox, BullMQ create
 * consumer, audit, reconcile, TTLs) in this process over hollow runtimes. Their commands
 * go through one shared connection (auto-pipelined, as a real host's do through its one);
 * each has its own blocking connections (ops inbox, BullMQ). They never sense the host
 * machine: no PSI or host-memory refusal (they all share one machine that is not theirs),
 * no network self-test, no layers. Refused outside a benchmark (guard.ts).
 */
export async function startHollowHosts(options: HollowHostsOptions): Promise<HollowHosts> {
  refuseOutsideBenchmarks();
  const { redisUrl, logger } = options;
  const redis = connectRedis(redisUrl);
  const blocking: Redis[] = [];
  const registry = new SandboxRegistry(redis);
  const commands = new CommandLog(redis);
  const hosts: { host: WorkerHost; runtime: HollowRuntime }[] = [];
  const width = String(options.count).length;
  try {
    for (let i = 0; i < options.count; i++) {
      const nodeId = `hollow-${options.idPrefix ?? ''}${String(i).padStart(width, '0')}`;
      const runtime = new HollowRuntime();
      const host = new WorkerHost({
        config: { ...options.config, ...options.capacity, nodeId, pool: HOLLOW_POOL, hostReserveMiB: 0, psi: { memoryFullMaxPct: 0, cpuSomeMaxPct: 0 }, syncLayers: [] },
        redis,
        connectBlocking: () => {
          const connection = connectRedis(redisUrl);
          blocking.push(connection);
          return connection;
        },
        connectJobs: () => connectJobRedis(redisUrl),
        registry,
        commands,
        runtime,
        layerFiles: async (digest) => ({ digest, imagePath: `/nonexistent/hollow/${digest}` }),
        storeLayerImage: () => Promise.reject(new Error('a hollow host stores no layers')),
        storeSplitLayer: () => Promise.reject(new Error('a hollow host stores no layers')),
        hibernatedImageDirOf: (id) => `/nonexistent/hollow/hibernated/${id}`,
        forkImageDirOf: (id) => `/nonexistent/hollow/forks/${id}`,
        tmpDir: '/nonexistent/hollow/tmp',
        logger,
      });
      hosts.push({ host, runtime });
    }
    await Promise.all(hosts.map(({ host }) => host.start()));
  } catch (err) {
    await stopAll();
    throw err;
  }

  async function stopAll(): Promise<void> {
    await Promise.all(hosts.map(({ host }) => host.stop({ destroySandboxes: true }).catch((err: unknown) => logger.warn({ err, nodeId: host.nodeId }, 'stopping a hollow host failed'))));
    await Promise.all([redis, ...blocking].map((c) => c.quit().catch(() => c.disconnect())));
  }

  return {
    nodeIds: hosts.map(({ host }) => host.nodeId),
    sandboxesByNode: () => new Map(hosts.map(({ host, runtime }) => [host.nodeId, runtime.ids()])),
    stop: stopAll,
  };
}
