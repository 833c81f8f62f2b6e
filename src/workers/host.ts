import { CreateJob, NodeOp, isTerminal, reservationOf, type Sandbox } from '../api/index.ts';
import { InboxConsumer, pendingOps, type InboxLane, type InboxReceipt } from '../queues/index.ts';
import { PoolRegistry, keys } from '../registry/index.ts';
import { handleCreate } from './create-handler.ts';
import { heartbeatOf } from './heartbeat.ts';
import { HostContext, type WorkerHostDeps } from './host-context.ts';
import { OpHandler } from './op-handler.ts';
import { PoolKeeper } from './pool-keeper.ts';

export type { WorkerHostDeps } from './host-context.ts';

const OPS_CONCURRENCY = 256;
const REGISTRY_SYNC_MS = 3000;
/** How often the inits of local sandboxes are checked (two small /proc reads each). */
const INIT_WATCH_MS = 2000;
/** How often warm pools are refilled and checked. */
const POOL_TICK_MS = 500;
const SYNC_RETRY_MS = 1000;
/** How often the network self-test may act: keep rollbox's rules in the host's firewall, run a round when due. */
const NETWORK_TICK_MS = 5000;
/**
 * On stop, how long running operations may finish before the host stops waiting on them.
 * A command can run for hours (a background one up to 24 h): past this, stop goes on, and
 * its sandbox is destroyed (embedded stack) or adopted by the next start, whose reconcile
 * ends commands nobody collects.
 */
const STOP_GRACE_MS = 5000;

/**
 * A worker host. Its lifecycle:
 *   start: reconcile (adopt what Redis says runs here, remove everything else) -> network
 *          self-test -> first heartbeat -> (cloud hosts) layer sync -> take from its inboxes
 *   run:   creates under local admission (create-handler.ts), operations on its sandboxes
 *          (op-handler.ts), heartbeats, TTLs, init watch, registry sync, network self-test,
 *          warm pools (pool-keeper.ts)
 *   stop:  stop taking, give running operations a grace, (embedded stack) destroy all
 */
export class WorkerHost {
  private readonly ctx: HostContext;
  private readonly ops: OpHandler;
  private readonly pools: PoolKeeper;
  private inboxes: InboxConsumer[] = [];
  private timers: NodeJS.Timeout[] = [];
  /** False while a cloud host syncs its layers: placement skips it. */
  private ready: boolean;
  private syncedLayers: string[] | undefined;
  private readonly stopping = new AbortController();
  private networkTick: Promise<void> | undefined;

  constructor(private readonly deps: WorkerHostDeps) {
    this.ctx = new HostContext(deps);
    this.ops = new OpHandler(this.ctx);
    this.pools = new PoolKeeper(this.ctx, new PoolRegistry(deps.redis), deps.config.poolRefillConcurrency);
    this.ready = !deps.syncLayers;
  }

  get nodeId(): string {
    return this.ctx.nodeId;
  }

  async start(): Promise<void> {
    const { ctx } = this;
    await this.reconcile();
    await this.tickNetwork();
    await this.heartbeat();
    await this.syncLayersBeforeReady();
    if (ctx.stopped) return;
    const { config } = this.deps;
    this.inboxes = [this.inbox('create', config.maxStarting, (m) => handleCreate(ctx, CreateJob.parse(m))), this.inbox('ops', OPS_CONCURRENCY, (m, r) => this.ops.handle(NodeOp.parse(m), r))];
    const requeued = await Promise.all(this.inboxes.map((i) => i.start()));
    const every = (ms: number, what: string, fn: () => Promise<void>) => this.timers.push(setInterval(() => void fn().catch((err) => ctx.log.warn({ err }, `${what} failed`)), ms));
    every(config.heartbeatMs, 'heartbeat', () => this.heartbeat());
    every(1000, 'ttl sweep', () => this.expireTtls());
    every(REGISTRY_SYNC_MS, 'registry sync', () => this.syncWithRegistry());
    every(INIT_WATCH_MS, 'init watch', () => this.watchInits());
    every(NETWORK_TICK_MS, 'network self-test', () => this.tickNetwork());
    every(POOL_TICK_MS, 'warm pools', () => this.pools.tick());
    for (const t of this.timers) t.unref();
    ctx.log.info({ adopted: ctx.local.size, requeued: requeued.reduce((a, b) => a + b, 0) }, 'worker host started');
  }

  private inbox(lane: InboxLane, concurrency: number, handle: (message: unknown, receipt: InboxReceipt) => Promise<void>): InboxConsumer {
    const { ctx } = this;
    return new InboxConsumer({
      nodeId: this.nodeId,
      lane,
      redis: this.deps.redis,
      blocking: this.deps.connectBlocking(),
      concurrency,
      handle,
      onError: (err) => ctx.log.error({ err, lane }, 'inbox message failed'),
    });
  }

  /** Heartbeats say `ready: false` until the layer set is in this host's own store. */
  private async syncLayersBeforeReady(): Promise<void> {
    const { syncLayers } = this.deps;
    const { ctx } = this;
    if (!syncLayers) return;
    const beat = setInterval(() => void this.heartbeat().catch((err) => ctx.log.warn({ err }, 'heartbeat failed')), this.deps.config.heartbeatMs);
    try {
      while (!ctx.stopped) {
        try {
          this.syncedLayers = await syncLayers(this.stopping.signal);
          break;
        } catch (err) {
          if (ctx.stopped) return;
          ctx.log.warn({ err }, 'layer sync failed; retrying');
          await new Promise((r) => setTimeout(r, SYNC_RETRY_MS));
        }
      }
    } finally {
      clearInterval(beat);
    }
    this.ready = true;
    ctx.log.info({ layers: this.syncedLayers?.length }, 'layers synced; ready');
    await this.heartbeat();
  }

  /**
   * Stops taking work. With `destroySandboxes` (the embedded `rollbox up` stack), every
   * local sandbox is also stopped and ends `terminated`; without it they keep running
   * and the next start adopts them.
   */
  async stop(options: { destroySandboxes: boolean }): Promise<void> {
    const { ctx } = this;
    if (ctx.stopped) return;
    ctx.stopped = true;
    this.stopping.abort();
    for (const t of this.timers) clearInterval(t);
    await this.pools.stop({ destroy: options.destroySandboxes });
    // A round in flight holds a probe network: it ends before the stop's reconcile removes everything.
    await this.networkTick;
    // Heartbeats (unhealthy: nothing new is placed here) go on through the grace, or a
    // host that waits on a long command would be declared lost and its sandboxes failed.
    const beat = setInterval(() => void this.heartbeat().catch(() => undefined), this.deps.config.heartbeatMs);
    try {
      await this.heartbeat();
      await Promise.all(this.inboxes.map((i) => i.stop()));
      await this.untilIdle(STOP_GRACE_MS);
    } finally {
      clearInterval(beat);
    }
    const busy = this.busy();
    if (busy > 0) ctx.log.warn({ inFlight: busy }, 'operations still running at stop; not waiting for them');
    if (options.destroySandboxes) {
      await Promise.all(
        ctx.local.ids().map(async (id) => {
          await ctx.removeLocal(id);
          await this.deps.registry.transition(id, 'terminated', { node: this.nodeId, detail: 'worker host shut down' });
        }),
      );
      await this.deps.runtime.reconcile(new Set());
      await this.deps.redis.hdel(keys.nodes, this.nodeId);
      // Commands cut short by the destroys now finish: let them record their results.
      await this.untilIdle(STOP_GRACE_MS);
    }
  }

  private busy(): number {
    return this.inboxes.reduce((n, i) => n + i.busy, 0);
  }

  private async untilIdle(ms: number): Promise<void> {
    for (const until = Date.now() + ms; this.busy() > 0 && Date.now() < until; ) await new Promise((r) => setTimeout(r, 50));
  }

  /** Adopt sandboxes Redis says are ours and still run; remove everything else. */
  private async reconcile(): Promise<void> {
    const { ctx } = this;
    const { registry, runtime, commands } = this.deps;
    const ids = await registry.sandboxesOfNode(this.nodeId);
    const records = (await Promise.all(ids.map((id) => registry.get(id)))).filter((s): s is Sandbox => !!s && !isTerminal(s.state));
    const live = records.filter((s) => s.state === 'running' || s.state === 'paused' || s.state === 'stopping');
    const pooled = await this.pools.toAdopt();
    const result = await runtime.reconcile(new Set([...live.map((s) => s.id), ...pooled.keys()]));
    const adopted = new Set(result.adopted);
    await this.pools.adopted(pooled, adopted);
    for (const s of records) {
      if (adopted.has(s.id)) {
        const { memoryMiB, cpuMillis, diskMiB } = reservationOf(s.spec.resources);
        ctx.local.set({ id: s.id, memoryMiB, cpuMillis, diskMiB, expiresAtMs: Date.parse(s.expiresAt ?? '') || Infinity, starting: false });
      } else if (s.state !== 'pending' && s.state !== 'hibernated') {
        // Its container is gone (host rebooted, or the worker died mid-create).
        await registry.transition(s.id, 'failed', { failureReason: s.state === 'creating' ? 'infra_error' : 'lost', detail: 'container not found when the worker host restarted' });
      }
    }
    if (result.removed.length) ctx.log.info({ removed: result.removed }, 'reconcile removed leftovers');
    // Commands that were running when this host went down: their outcome is unknown.
    // Queued ones stay: they are still in this node's inbox.
    const inFlight = (await pendingOps(this.deps.redis, this.nodeId, { includeQueued: false })).flatMap((m) => {
      const op = NodeOp.safeParse(m);
      return op.success && op.data.kind === 'exec' ? [op.data] : [];
    });
    const unknown = await commands.settleUnfinished(inFlight, `its worker host ${this.nodeId} restarted while it ran`, { includeQueued: false });
    if (unknown) ctx.log.warn({ commands: unknown }, 'commands interrupted by the restart marked unknown');
  }

  private async heartbeat(): Promise<void> {
    const { ctx } = this;
    const heartbeat = heartbeatOf({
      nodeId: this.nodeId,
      config: this.deps.config,
      atMs: ctx.now(),
      healthy: !ctx.stopped,
      sync: this.deps.syncLayers ? { ready: this.ready, syncedLayers: this.syncedLayers ?? [] } : undefined,
      local: ctx.local,
      diskCapacityMiB: ctx.diskSpace().capacityMiB,
      cachedLayers: this.deps.runtime.mountedLayers(),
      network: ctx.networkHealth,
      pools: this.pools.status(),
    });
    await this.deps.redis.hset(keys.nodes, this.nodeId, JSON.stringify(heartbeat));
  }

  /** The network self-test's tick (one at a time); verdict changes are logged, the heartbeat carries them to placement. */
  private async tickNetwork(): Promise<void> {
    const { ctx } = this;
    const selfTest = this.deps.networkSelfTest;
    if (!selfTest || ctx.stopped || this.networkTick) return;
    this.networkTick = (async () => {
      const before = ctx.networkHealth?.allowlist;
      const health = await selfTest.tick();
      if (!health) return;
      ctx.networkHealth = health;
      if (health.putBack) ctx.log.warn({ putBack: health.putBack }, "rollbox's rules in the host's firewall were gone (flushed by its owner); put back");
      if (health.allowlist === 'failing') ctx.log.error({ detail: health.detail, firewall: health.firewall }, 'network self-test failed: allowlist sandboxes are placed elsewhere');
      else if (before !== 'ok') ctx.log.info({ firewall: health.firewall }, 'network self-test passed');
    })().finally(() => (this.networkTick = undefined));
    await this.networkTick;
  }

  /** Inits that died while no command ran (killed from the host, say) are noticed here. */
  private async watchInits(): Promise<void> {
    for (const s of this.ctx.local.running()) await this.ctx.checkAlive(s.id);
  }

  /**
   * Registry wins: a sandbox that ended while this host could not act on it (declared
   * lost during a long stall, or a delete whose message was lost) is removed here.
   */
  private async syncWithRegistry(): Promise<void> {
    const { ctx } = this;
    const ids = ctx.local.running().map((s) => s.id);
    const states = await this.deps.registry.states(ids);
    for (const [i, state] of states.entries()) {
      const id = ids[i]!;
      if (state !== undefined && !isTerminal(state) && state !== 'stopping') continue;
      await ctx.removeLocal(id);
      if (state === 'stopping') await this.deps.registry.transition(id, 'terminated', { node: this.nodeId });
      ctx.log.info({ sandboxId: id, state }, 'removed a sandbox the registry no longer keeps running here');
    }
  }

  private async expireTtls(): Promise<void> {
    const { ctx } = this;
    const now = ctx.now();
    for (const s of ctx.local.running()) {
      if (s.expiresAtMs > now) continue;
      await ctx.removeLocal(s.id);
      await this.deps.registry.transition(s.id, 'failed', { node: this.nodeId, failureReason: 'timeout', detail: 'ttl expired' });
      ctx.log.info({ sandboxId: s.id }, 'ttl expired');
    }
  }
}
