import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import type { BurstStatus, Pool } from '../api/index.ts';
import type { Config } from '../config/index.ts';
import { ConsoleService, SignalRecorder, recentCreates, registerCapacityMetrics } from '../gateway/console/index.ts';
import type { NodeDirectory } from '../queues/index.ts';
import type { JobRolloutTimesStore } from '../rollouts/index.ts';
import { SignalStore, type SandboxRegistry } from '../registry/index.ts';

/**
 * Part of the composition root (roles/index.ts): the operator console's pieces. The signal
 * recorder comes first (the gateway's metrics feed it); the console service once the
 * pools and the burst controller exist, with its capacity gauges in the gateway's registry.
 */
export function gatewayConsoleOf(config: Config, redis: Redis, registry: Pick<SandboxRegistry, 'get'>, directory: Pick<NodeDirectory, 'list'>, logger: Logger, now: () => number) {
  const store = new SignalStore(redis);
  const signals = new SignalRecorder({ store, nodes: () => directory.list(), localPool: config.node.pool, flushMs: config.capacity.signalsFlushMs, logger: logger.child({ name: 'signals' }), now });
  const service = (deps: { pools: () => Promise<Pool[]>; rolloutJobs: Pick<JobRolloutTimesStore, 'latest'>; burst?: { status(): Promise<BurstStatus> }; metricsRegistry: Registry }): ConsoleService => {
    const console = new ConsoleService({
      signals: store,
      nodes: () => directory.list(),
      pools: deps.pools,
      recent: (limit) => recentCreates(redis, registry, limit),
      rolloutJobs: (limit) => deps.rolloutJobs.latest(limit),
      ...(deps.burst ? { burst: deps.burst } : {}),
      localPool: config.node.pool,
      capacity: { ...(config.capacity.safePerNode !== undefined ? { safePerNode: config.capacity.safePerNode } : {}), headroom: config.capacity.headroom },
      now,
    });
    registerCapacityMetrics(deps.metricsRegistry, console, config.capacity.windowSeconds);
    return console;
  };
  return { signals, service };
}
