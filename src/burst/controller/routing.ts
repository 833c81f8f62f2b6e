import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { type BurstDecisionReason, type BurstPolicy, type CreateSandboxRequest } from '../../api/index.ts';
import type { PlacementRequest } from '../../queues/index.ts';
import { keys } from '../../registry/index.ts';
import { decideCreate } from '../policy/index.ts';
import { CLOUD_POOL } from './fleet.ts';
import type { BurstMetrics } from './metrics.ts';
import type { SharedState } from './state.ts';

/** A diverted create refused outright (no cloud slot, no local room) counts as demand this long. */
const UNMET_DEMAND_MS = 30_000;

export interface CreateRouterDeps {
  redis: Redis;
  metrics: BurstMetrics;
  logger: Logger;
  now: () => number;
  random: () => number;
}

/** What routing reads of the controller's view of the cluster, as of its last tick. */
export interface RoutingView {
  state: SharedState;
  synced: ReadonlySet<string>;
  policy: BurstPolicy;
}

/**
 * Routes each create a gateway receives: local, or a ready cloud host. Every gateway
 * routes its own creates from the shared state it last read; a diverted create that
 * found no cloud slot is remembered as demand the leader provisions for.
 */
export class CreateRouter {
  /**
   * Decision counts not yet added to the shared hash: added once per controller tick (and
   * before a status read), not per create, where they cost a MULTI of three or four calls
   * (bench:scale: 4 of a create's 94 Redis calls).
   */
  private readonly unflushed = new Map<string, number>();

  constructor(private readonly deps: CreateRouterDeps) {}

  /**
   * Local: the local pool as before. Cloud: a ready cloud host holding every layer of the
   * request (d-choice among them). When no cloud host has a slot, it falls back to the
   * local pool at once (as the simulator models it) and counts as pending diverted demand.
   */
  async place(
    view: RoutingView,
    create: { sandboxId: string; request: CreateSandboxRequest; layerDigests: readonly string[] },
    local: PlacementRequest,
    place: (placement: PlacementRequest) => Promise<string | undefined>,
  ): Promise<{ placement: PlacementRequest; node: string | undefined }> {
    const { layerDigests } = create;
    const decision = decideCreate(view.state.diversion, { layers: layerDigests, stayLocal: create.request.placement?.stayLocal }, view.synced, this.deps.random(), view.policy);
    if (decision.target === 'cloud') {
      const draining = new Set(view.state.hosts.filter((h) => h.state === 'terminating').map((h) => h.id));
      const cloud: PlacementRequest = { ...local, pool: CLOUD_POOL, avoid: draining, requiredLayers: [...layerDigests] };
      const node = await place(cloud);
      if (node) {
        this.count('cloud', decision.reason);
        return { placement: cloud, node };
      }
      this.deps.metrics.fallbacks.inc();
      await this.deps.redis.zadd(keys.burstFellBack, this.deps.now(), create.sandboxId);
    }
    this.count('local', decision.reason);
    return { placement: local, node: await place(local) };
  }

  /**
   * Diverted creates that went local for want of a cloud slot: those still live, plus
   * those that failed (refused outright: they never got a sandbox) in the last
   * UNMET_DEMAND_MS. Three calls whatever their number: the sandbox transition script
   * moves an ended one out of the live set (a failed one into the failed set, by when it
   * fell back), so nothing here reads a sandbox's state.
   */
  async pendingDivertedDemand(nowMs: number): Promise<number> {
    const [, live, recentlyFailed] = (await this.deps.redis
      .multi()
      .zremrangebyscore(keys.burstFellBackFailed, '-inf', `(${nowMs - UNMET_DEMAND_MS}`)
      .zcard(keys.burstFellBack)
      .zcard(keys.burstFellBackFailed)
      .exec()) as [unknown, [null, number], [null, number]];
    return live[1] + recentlyFailed[1];
  }

  private count(target: 'local' | 'cloud', reason: BurstDecisionReason): void {
    this.deps.metrics.creates.inc({ target, reason });
    const fields = [target === 'cloud' ? 'diverted' : 'local', `reason:${reason}`, ...(reason === 'stay_local' || reason === 'layers_not_synced' ? ['ineligible'] : [])];
    for (const field of fields) this.unflushed.set(field, (this.unflushed.get(field) ?? 0) + 1);
  }

  /** Adds the counts since the last flush to the shared hash (kept for the next one if Redis refuses). */
  async flushCounts(): Promise<void> {
    if (this.unflushed.size === 0) return;
    const taken = [...this.unflushed];
    this.unflushed.clear();
    const multi = this.deps.redis.multi();
    for (const [field, n] of taken) multi.hincrby(keys.burstCounts, field, n);
    try {
      await multi.exec();
    } catch (err) {
      for (const [field, n] of taken) this.unflushed.set(field, (this.unflushed.get(field) ?? 0) + n);
      this.deps.logger.warn({ err }, 'burst counters not updated');
    }
  }
}
