import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { NodeOp } from '../../api/index.ts';
import { pendingOps, type NodeDirectory } from '../../queues/index.ts';
import type { CreateJobQueues } from '../../queues/jobs/index.ts';
import { keys, type CommandLog, type SandboxRegistry } from '../../registry/index.ts';
import type { LayerCollector } from './layer-gc.ts';

/**
 * Cluster housekeeping run by every gateway (one at a time per item, through Redis locks):
 * - a worker host whose heartbeat stopped: its sandboxes end `failed(lost)`, its create queue goes;
 * - a sandbox that never settled (its gateway died mid-create): it ends `failed(infra_error)`;
 * - a hibernated sandbox past its TTL: it ends `failed(timeout)`;
 * - every `layerGc.intervalMs`: unreferenced layers are collected (see layer-gc.ts).
 */
export class Janitor {
  private timer: NodeJS.Timeout | undefined;
  private running = false;
  private lastLayerGcMs = 0;

  constructor(
    private readonly deps: { redis: Redis; registry: SandboxRegistry; commands: CommandLog; directory: NodeDirectory; lostAfterMs: number; intervalMs: number; logger: Logger; now: () => number; layerGc?: { collector: LayerCollector; intervalMs: number }; createJobs?: Pick<CreateJobQueues, 'discard'> },
  ) {}

  start(): void {
    this.timer = setInterval(() => void this.sweep(), this.deps.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }

  async sweep(): Promise<void> {
    if (this.running) return;
    this.running = true;
    try {
      for (const nodeId of this.deps.directory.silentNodes(this.deps.lostAfterMs)) await this.declareLost(nodeId);
      // TTLs of hibernated sandboxes (no worker host runs them, so none expires them).
      const expired = await this.deps.registry.hibernatedPastTtl(this.deps.now());
      for (const id of expired) await this.deps.registry.transition(id, 'failed', { from: ['hibernated'], failureReason: 'timeout', detail: 'ttl expired while hibernated' });
      await this.deps.registry.unwatchHibernatedTtl(expired);
      for (const id of await this.deps.registry.unsettledBefore(this.deps.now())) {
        await this.deps.registry.transition(id, 'failed', { from: ['pending', 'creating'], failureReason: 'infra_error', detail: 'the sandbox did not start in time' });
        await this.deps.redis.zrem(keys.unsettled, id);
      }
      const { layerGc } = this.deps;
      if (layerGc && this.deps.now() - this.lastLayerGcMs >= layerGc.intervalMs) {
        this.lastLayerGcMs = this.deps.now();
        await layerGc.collector.collect();
      }
    } catch (err) {
      this.deps.logger.warn({ err }, 'janitor sweep failed');
    } finally {
      this.running = false;
    }
  }

  private async declareLost(nodeId: string): Promise<void> {
    const { redis, registry, logger } = this.deps;
    const locked = await redis.set(keys.lock(`lost:${nodeId}`), '1', 'PX', 10_000, 'NX');
    if (!locked) return;
    const ids = await registry.sandboxesOfNode(nodeId);
    // Creates that have not run yet (pending, creating) are left to their gateway, which
    // places them elsewhere (or to the unsettled sweep if that gateway is gone too);
    // hibernated ones run nowhere.
    for (const id of ids) {
      await registry.transition(id, 'failed', { from: ['running', 'paused', 'stopping'], node: nodeId, failureReason: 'lost', detail: `worker host ${nodeId} stopped heartbeating` });
    }
    const unfinished = (await pendingOps(redis, nodeId, { includeQueued: true })).flatMap((m) => {
      const op = NodeOp.safeParse(m);
      return op.success && op.data.kind === 'exec' ? [op.data] : [];
    });
    const unknown = await this.deps.commands.settleUnfinished(unfinished, `its worker host ${nodeId} stopped heartbeating`, { includeQueued: true });
    // Its gateways placed its waiting creates elsewhere as it went silent; nobody takes the rest.
    await this.deps.createJobs?.discard(nodeId).catch((err: unknown) => logger.warn({ err, nodeId }, 'discarding a lost node\'s create queue failed'));
    await redis.hdel(keys.nodes, nodeId);
    logger.warn({ nodeId, sandboxes: ids.length, commandsUnknown: unknown }, 'worker host lost');
  }
}
