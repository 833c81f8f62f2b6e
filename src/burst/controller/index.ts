import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import { BurstPolicy, BurstStatus, type BurstDecisionReason, type CreateSandboxRequest, type Sandbox } from '../../api/index.ts';
import type { NodeDirectory, PlacementRequest } from '../../queues/index.ts';
import { keys, type ImageRegistry, type SandboxRegistry } from '../../registry/index.ts';
import { planCloudScaling, stepDiversion } from '../policy/index.ts';
import type { CloudProvider } from '../providers/index.ts';
import type { TraceRecorder } from '../trace/index.ts';
import { CLOUD_POOL, LIST_EVERY_MS, observeLoad, stepFleet } from './fleet.ts';
import { LeaderLease } from './lease.ts';
import { burstMetrics, type BurstMetrics } from './metrics.ts';
import { CreateRouter } from './routing.ts';
import { INITIAL_STATE, SharedState, parseStored, type HostRecord } from './state.ts';

export { CLOUD_POOL } from './fleet.ts';

export interface BurstControllerDeps {
  redis: Redis;
  directory: NodeDirectory;
  /** Resolves the synced set's names: an imported image's name stands for all its layers. */
  images: Pick<ImageRegistry, 'layersOf'>;
  registry: SandboxRegistry;
  /** Undefined: nothing is provisioned; cloud hosts that operators start are still used. */
  provider: CloudProvider | undefined;
  config: {
    tickMs: number;
    /** The cluster's pre-synced layer set: layer names or digests, or image names. */
    syncLayers: readonly string[];
    localPool: string;
    lostAfterMs: number;
    redisUrl: string;
  };
  gatewayId: string;
  /** The URL cloud hosts fetch layers from (known once the gateway listens). */
  gatewayUrl: () => string;
  /** A token cloud hosts use to fetch layer blobs. */
  issueHostToken: () => Promise<string>;
  recorder: TraceRecorder;
  metricsRegistry: Registry;
  logger: Logger;
  now: () => number;
  random: () => number;
}

/**
 * Live cloud burst. Every gateway runs one: it reads the shared state each tick and
 * routes its own creates (routing.ts: local, or a ready cloud host, by the pure policy).
 * Only the gateway holding the Redis lock leads: it computes local utilization from the
 * heartbeats, steps diversion, and provisions, drains and terminates cloud hosts.
 */
export class BurstController {
  private policy: BurstPolicy = BurstPolicy.parse({});
  private state: SharedState = INITIAL_STATE;
  private synced = new Set<string>();
  private timer: NodeJS.Timeout | undefined;
  private ticking = false;
  private lastListAtMs = 0;
  private readonly terminations = new Set<Promise<void>>();
  private readonly log: Logger;
  private readonly metrics: BurstMetrics;
  private readonly lease: LeaderLease;
  private readonly router: CreateRouter;

  constructor(private readonly deps: BurstControllerDeps) {
    this.log = deps.logger.child({ component: 'burst' });
    this.metrics = burstMetrics(deps.metricsRegistry, () => this.state);
    this.lease = new LeaderLease(deps.redis, deps.gatewayId);
    this.router = new CreateRouter({ ...deps, metrics: this.metrics, logger: this.log });
  }

  async start(): Promise<void> {
    await this.tick();
    this.timer = setInterval(() => void this.tick(), this.deps.config.tickMs);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    while (this.ticking) await new Promise((r) => setTimeout(r, 20));
    await this.router.flushCounts();
    await Promise.all(this.terminations);
    await this.lease.release().catch(() => {});
  }

  async tick(): Promise<void> {
    if (this.ticking) return;
    this.ticking = true;
    try {
      const { redis } = this.deps;
      await this.router.flushCounts();
      const [policyJson = null, stateJson = null] = await redis.mget(keys.burstPolicy, keys.burstState);
      this.policy = parseStored(policyJson, BurstPolicy, this.policy);
      this.state = parseStored(stateJson, SharedState, this.state);
      if (await this.lease.hold(Math.max(3 * this.deps.config.tickMs, 3000))) {
        await this.publishSyncedLayers();
        this.state = await this.lead(this.state);
        // Fenced: a leader that lost the lock mid-tick (a slow provider call) does not overwrite its successor.
        await this.lease.setIfLeader(keys.burstState, JSON.stringify(this.state));
      }
      this.synced = new Set(await redis.smembers(keys.burstSyncedLayers));
    } catch (err) {
      this.log.warn({ err }, 'burst tick failed');
    } finally {
      this.ticking = false;
    }
  }

  /** Names resolve once registered; a layer uploaded (or an image imported) later joins the set then. */
  private async publishSyncedLayers(): Promise<void> {
    const resolved = await Promise.all(this.deps.config.syncLayers.map((ref) => this.deps.images.layersOf(ref).catch(() => [])));
    const digests = [...new Set(resolved.flat())];
    const current = new Set(await this.deps.redis.smembers(keys.burstSyncedLayers));
    if (digests.length === current.size && digests.every((d) => current.has(d))) return;
    const multi = this.deps.redis.multi().del(keys.burstSyncedLayers);
    if (digests.length) multi.sadd(keys.burstSyncedLayers, ...digests);
    await multi.exec();
  }

  /** One leader tick: diversion from the local pool's load, the fleet's state machine, then scaling. */
  private async lead(previous: SharedState): Promise<SharedState> {
    const { directory, config } = this.deps;
    const policy = this.policy;
    const nowMs = this.deps.now();
    const candidates = directory.candidates();
    const { utilization, utilizationWithCloudLoad, localHosts } = observeLoad(candidates, policy, config);
    // No local host reporting (a cluster starting, before its first heartbeat) is no load to
    // divert from: diversion never starts then (it goes on if the hosts vanish mid-burst).
    const diversion = localHosts === 0 && !previous.diversion.diverting ? previous.diversion : stepDiversion(previous.diversion, utilization, nowMs, policy, utilizationWithCloudLoad);
    if (diversion.diverting !== previous.diversion.diverting) this.log.info({ utilization, diverting: diversion.diverting }, diversion.diverting ? 'burst: diverting eligible creates to the cloud pool' : 'burst: diversion stopped');

    const fleet = stepFleet({ previous, candidates, listedProviderIds: await this.listProviderHosts(nowMs), nowMs, lostAfterMs: config.lostAfterMs, drainGraceMs: this.drainGraceMs() });
    let retiredVmMs = previous.retiredVmMs;
    for (const { host, why } of fleet.retire) {
      retiredVmMs += Math.max(0, nowMs - host.provisionedAtMs);
      if (why === 'vanished') this.log.warn({ hostId: host.id }, 'burst: cloud host vanished');
      this.terminate(host, why);
    }
    const { hosts } = fleet;
    const pendingDivertedDemand = await this.router.pendingDivertedDemand(nowMs);
    const recentProvisionsMs = previous.recentProvisionsMs.filter((t) => nowMs - t < 60_000);
    const active = hosts.filter((h) => h.state !== 'terminating');
    const plan = planCloudScaling(
      { cloudHosts: active.map((h) => ({ id: h.id, state: h.state === 'ready' ? 'ready' : 'provisioning', sandboxes: h.sandboxes, idleSinceMs: h.idleSinceMs })), pendingDivertedDemand, provisionsInLastMinute: recentProvisionsMs.length, nowMs },
      policy,
    );
    for (const id of plan.terminate) {
      const host = hosts.find((h) => h.id === id)!;
      // Drain first: gateways stop placing on it when they read this state; terminate after a grace.
      if (host.providerId !== null) Object.assign(host, { state: 'terminating', terminatingSinceMs: nowMs });
    }
    if (this.deps.provider) {
      for (let i = 0; i < plan.provision; i++) {
        const host = await this.provision(nowMs);
        if (!host) break;
        hosts.push(host);
        recentProvisionsMs.push(nowMs);
      }
    }
    return { diversion, utilization, utilizationAtMs: nowMs, hosts, recentProvisionsMs, retired: fleet.retired, retiredVmMs };
  }

  /** The provider's machines, asked now and then (a command provider runs a program for it). */
  private async listProviderHosts(nowMs: number): Promise<Set<string> | undefined> {
    if (!this.deps.provider || nowMs - this.lastListAtMs < LIST_EVERY_MS) return undefined;
    this.lastListAtMs = nowMs;
    try {
      const ids = new Set((await this.deps.provider.list()).map((h) => h.id));
      const known = new Set(this.state.hosts.map((h) => h.providerId));
      const orphans = [...ids].filter((id) => !known.has(id));
      if (orphans.length) this.log.warn({ orphans }, 'burst: the provider lists machines this controller does not know (left alone)');
      return ids;
    } catch (err) {
      this.log.warn({ err }, 'burst: provider list failed');
      return undefined;
    }
  }

  /** Long enough for every gateway to have read the draining state. */
  private drainGraceMs(): number {
    return 2 * this.deps.config.tickMs + 1000;
  }

  private async provision(nowMs: number): Promise<HostRecord | undefined> {
    const hostId = `cloud-${randomBytes(4).toString('hex')}`;
    try {
      const { id } = await this.deps.provider!.provision({
        hostId,
        pool: CLOUD_POOL,
        gatewayUrl: this.deps.gatewayUrl(),
        token: await this.deps.issueHostToken(),
        redisUrl: this.deps.config.redisUrl,
        layers: [...this.synced].sort(),
        slots: this.policy.cloudHostSandboxes,
      });
      this.metrics.provisions.inc({ outcome: 'ok' });
      this.log.info({ hostId, providerId: id }, 'burst: cloud host provisioned');
      return { id: hostId, providerId: id, state: 'provisioning', sandboxes: 0, provisionedAtMs: nowMs, idleSinceMs: null, terminatingSinceMs: null };
    } catch (err) {
      this.metrics.provisions.inc({ outcome: 'error' });
      this.log.error({ err, hostId }, 'burst: provisioning failed');
      return undefined;
    }
  }

  /** Runs in the background: a provider may take a while to stop a machine. */
  private terminate(host: HostRecord, why: string): void {
    if (host.providerId === null || !this.deps.provider) return;
    const providerId = host.providerId;
    const done = this.deps.provider
      .terminate(providerId)
      .then(() => this.log.info({ hostId: host.id, why }, 'burst: cloud host terminated'))
      .catch((err: unknown) => this.log.error({ err, hostId: host.id }, 'burst: terminate failed'))
      .finally(() => this.terminations.delete(done));
    this.terminations.add(done);
  }

  /** Where a new create goes (see CreateRouter), as of the shared state of the last tick. */
  placeCreate(
    sandboxId: string,
    request: CreateSandboxRequest,
    layerDigests: readonly string[],
    local: PlacementRequest,
    place: (placement: PlacementRequest) => Promise<string | undefined>,
  ): Promise<{ placement: PlacementRequest; node: string | undefined }> {
    return this.router.place({ state: this.state, synced: this.synced, policy: this.policy }, { sandboxId, request, layerDigests }, local, place);
  }

  recordCreate(atEpochMs: number, tenant: string, request: CreateSandboxRequest, sandbox: Sandbox | undefined): void {
    this.deps.recorder.record(atEpochMs, tenant, request, sandbox);
  }

  async status(): Promise<BurstStatus> {
    await this.router.flushCounts();
    const counts = await this.deps.redis.hgetall(keys.burstCounts);
    const n = (field: string) => Number(counts[field] ?? 0);
    const reasons: BurstDecisionReason[] = ['not_diverting', 'stay_local', 'layers_not_synced', 'share', 'diverted'];
    return {
      diverting: this.state.diversion.diverting,
      divertingSinceMs: this.state.diversion.divertingSinceMs,
      utilization: this.state.utilization,
      utilizationAtMs: this.state.utilizationAtMs,
      policy: this.policy,
      syncedLayers: [...this.synced].sort(),
      counts: { diverted: n('diverted'), local: n('local'), ineligible: n('ineligible'), byReason: Object.fromEntries(reasons.map((r) => [r, n(`reason:${r}`)])) as Record<BurstDecisionReason, number> },
      vmHours: (this.state.retiredVmMs + this.state.hosts.reduce((sum, h) => sum + Math.max(0, this.deps.now() - h.provisionedAtMs), 0)) / 3_600_000,
      cloudHosts: this.state.hosts.map((h) => ({ id: h.id, state: h.state, sandboxes: h.sandboxes, slots: this.policy.cloudHostSandboxes, provisionedAtMs: h.provisionedAtMs, idleSinceMs: h.idleSinceMs })),
    };
  }

  /** Stored in Redis: every gateway (and the next start) uses it from its next tick. */
  async setPolicy(policy: BurstPolicy): Promise<BurstPolicy> {
    await this.deps.redis.set(keys.burstPolicy, JSON.stringify(policy));
    this.policy = policy;
    return policy;
  }
}
