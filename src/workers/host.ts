import { CreateJob, NodeOp, RollboxError, isTerminal, reservationOf, type Sandbox } from '../api/index.ts';
import { InboxConsumer, pendingOps } from '../queues/index.ts';
import { CreateJobConsumer } from '../queues/jobs/index.ts';
import { PoolRegistry, keys } from '../registry/index.ts';
import { handleCreate } from './create-handler.ts';
import { heartbeatOf } from './heartbeat.ts';
import { Audit } from './audit.ts';
import { HostContext, type WorkerHostDeps } from './host-context.ts';
import { pauseOf } from './local-sandboxes.ts';
import { OpHandler } from './op-handler.ts';
import { PoolKeeper } from './pool-keeper.ts';

export type { WorkerHostDeps } from './host-context.ts';

const OPS_CONCURRENCY = 256;
/** The audit's tick: it checks its share of the sandboxes (see audit.ts) this often. */
const AUDIT_TICK_MS = 1000;
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
 *          self-test -> first heartbeat -> (cloud hosts) layer sync -> take from its create
 *          queue (BullMQ) and its ops inbox
 *   run:   creates under local admission (create-handler.ts), operations on its sandboxes
 *          (op-handler.ts), heartbeats, network self-test, warm pools (pool-keeper.ts).
 *          Nothing here visits every sandbox on a timer: an init's death arrives as an
 *          event (the runtime's onExit), a TTL as its own timer (ctx.ttls), a delete as a
 *          message; the audit (audit.ts) is the slow, spread-out safety net behind them.
 *   stop:  stop taking, give running operations a grace, (embedded stack) destroy all
 */
export class WorkerHost {
  private readonly ctx: HostContext;
  private readonly ops: OpHandler;
  private readonly pools: PoolKeeper;
  private readonly audit: Audit;
  /** Heartbeats written; a later one that finds the node's entry gone means it was declared lost. */
  private beats = 0;
  private opsInbox: InboxConsumer | undefined;
  private creates: CreateJobConsumer<CreateJob> | undefined;
  private timers: NodeJS.Timeout[] = [];
  /** False until the host has started (adopted, tested, synced): placement skips it. */
  private ready = false;
  private syncedLayers: string[] | undefined;
  /** Its sandboxes' memory (resident, swapped), read after each heartbeat for the next. */
  private memoryHeld: { residentBytes: number; swappedBytes: number } | undefined;
  private readonly stopping = new AbortController();
  private networkTick: Promise<void> | undefined;

  constructor(private readonly deps: WorkerHostDeps) {
    this.ctx = new HostContext(deps);
    this.ops = new OpHandler(this.ctx);
    this.ctx.pauseAtTtl = (id, mode, untilMs) => this.ops.pauseAtTtl(id, mode, untilMs);
    this.pools = new PoolKeeper(this.ctx, new PoolRegistry(deps.redis), deps.config.poolRefillConcurrency);
    this.audit = new Audit({
      intervalMs: deps.config.auditMs,
      tickMs: AUDIT_TICK_MS,
      now: this.ctx.now,
      ids: () => this.ctx.local.ids(),
      check: (id) => this.checkOne(id),
      compareWithRegistry: () => this.compareWithRegistry(),
    });
  }

  get nodeId(): string {
    return this.ctx.nodeId;
  }

  /** The port relay's address (src/ports), told in heartbeats once set. */
  portRelay: string | undefined;

  /** The network namespace (a pid in it) of a tenant sandbox running here, for its port relay; else `invalid_state`. */
  async portNetnsOf(sandboxId: string): Promise<number> {
    const local = this.ctx.local.get(sandboxId);
    if (!local || local.starting || local.pool) throw new RollboxError('invalid_state', `sandbox ${sandboxId} is not running on worker host ${this.nodeId}`);
    if (local.paused) throw new RollboxError('invalid_state', `sandbox ${sandboxId} is paused; resume it first`);
    return this.deps.runtime.netnsPidOf(sandboxId);
  }

  async start(): Promise<void> {
    const { ctx } = this;
    const { config } = this.deps;
    this.deps.runtime.onExit((id) => void this.checkOne(id).catch((err) => ctx.log.warn({ err, sandboxId: id }, 'handling a dead init failed')));
    // A host coming back to sandboxes of its own heartbeats at once, saying `ready: false`
    // (placement skips it) until they are adopted, its network tested and (cloud hosts) its
    // layers synced: adopting thousands of sandboxes takes longer than a janitor waits
    // before it declares a silent host lost. A new host first speaks when ready.
    let beat: NodeJS.Timeout | undefined;
    const startBeating = async () => {
      beat ??= setInterval(() => void this.heartbeat().catch((err) => ctx.log.warn({ err }, 'heartbeat failed')), config.heartbeatMs);
      await this.heartbeat();
    };
    try {
      const own = await this.deps.registry.sandboxesOfNode(this.nodeId);
      if (own.length) await startBeating();
      await this.reconcile(own);
      await this.tickNetwork();
      if (this.deps.syncLayers) await startBeating();
      await this.syncLayersBeforeReady();
    } finally {
      clearInterval(beat);
    }
    if (ctx.stopped) return;
    this.ready = true;
    await this.heartbeat();
    this.creates = new CreateJobConsumer({
      nodeId: this.nodeId,
      connect: this.deps.connectJobs,
      concurrency: config.maxStarting,
      lockMs: config.lostAfterMs,
      parse: (data) => CreateJob.parse(data),
      handle: (job) => handleCreate(ctx, job),
      onError: (err) => ctx.log.error({ err }, 'create job failed'),
    });
    this.creates.start();
    this.opsInbox = new InboxConsumer({
      nodeId: this.nodeId,
      lane: 'ops',
      redis: this.deps.redis,
      blocking: this.deps.connectBlocking(),
      concurrency: OPS_CONCURRENCY,
      handle: (m, r) => this.ops.handle(NodeOp.parse(m), r),
      onError: (err) => ctx.log.error({ err }, 'inbox message failed'),
    });
    const requeued = await this.opsInbox.start();
    const every = (ms: number, what: string, fn: () => Promise<void>) => this.timers.push(setInterval(() => void fn().catch((err) => ctx.log.warn({ err }, `${what} failed`)), ms));
    every(config.heartbeatMs, 'heartbeat', () => this.heartbeat());
    every(AUDIT_TICK_MS, 'audit', () => this.audit.tick());
    every(NETWORK_TICK_MS, 'network self-test', () => this.tickNetwork());
    every(POOL_TICK_MS, 'warm pools', () => this.pools.tick());
    for (const t of this.timers) t.unref();
    ctx.log.info({ adopted: ctx.local.size, requeued }, 'worker host started');
  }

  /**
   * These lazy layers can no longer be guarded here (the gate died with its keeper): every
   * sandbox using them ends `failed(layer_lost)` before it reads again, and the layers are
   * unmounted, to be mounted afresh by the next sandbox.
   */
  async failSandboxesOnLayers(digests: readonly string[]): Promise<void> {
    const { ctx } = this;
    const ids = this.deps.runtime.sandboxesUsingLayers(new Set(digests));
    await Promise.all(
      ids.map(async (id) => {
        const pooled = ctx.local.get(id)?.pool;
        await ctx.removeLocal(id);
        if (!pooled) await this.deps.registry.transition(id, 'failed', { node: this.nodeId, failureReason: 'layer_lost', detail: 'a lazy layer it reads could no longer be guarded on its host (the gate died with its keeper)' });
      }),
    );
    await this.deps.runtime.unmountUnused(digests);
    if (ids.length) ctx.log.warn({ sandboxes: ids, layers: digests }, 'sandboxes on unguarded lazy layers failed');
  }

  /** A cloud host copies its layer set into its own store before it is ready. */
  private async syncLayersBeforeReady(): Promise<void> {
    const { syncLayers } = this.deps;
    const { ctx } = this;
    if (!syncLayers) return;
    while (!ctx.stopped) {
      try {
        this.syncedLayers = await syncLayers(this.stopping.signal);
        ctx.log.info({ layers: this.syncedLayers.length }, 'layers synced; ready');
        return;
      } catch (err) {
        if (ctx.stopped) return;
        ctx.log.warn({ err }, 'layer sync failed; retrying');
        await new Promise((r) => setTimeout(r, SYNC_RETRY_MS));
      }
    }
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
    ctx.ttls.clearAll();
    await this.pools.stop({ destroy: options.destroySandboxes });
    // A round in flight holds a probe network: it ends, and its probe is gone, before the stop's reconcile removes everything.
    await this.networkTick;
    await this.deps.networkSelfTest?.settled();
    // Heartbeats (unhealthy: nothing new is placed here) go on through the grace, or a
    // host that waits on a long command would be declared lost and its sandboxes failed.
    const beat = setInterval(() => void this.heartbeat().catch(() => undefined), this.deps.config.heartbeatMs);
    try {
      await this.heartbeat();
      await Promise.all([this.creates?.stop(STOP_GRACE_MS), this.opsInbox?.stop()]);
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
    this.deps.runtime.detach();
  }

  private busy(): number {
    return (this.creates?.busy ?? 0) + (this.opsInbox?.busy ?? 0);
  }

  private async untilIdle(ms: number): Promise<void> {
    for (const until = Date.now() + ms; this.busy() > 0 && Date.now() < until; ) await new Promise((r) => setTimeout(r, 50));
  }

  /** Adopt sandboxes Redis says are ours and still run; remove everything else. */
  private async reconcile(ids: readonly string[]): Promise<void> {
    const { ctx } = this;
    const { registry, runtime, commands } = this.deps;
    const records = (await Promise.all(ids.map((id) => registry.get(id)))).filter((s): s is Sandbox => !!s && !isTerminal(s.state));
    const live = records.filter((s) => s.state === 'running' || s.state === 'paused' || s.state === 'stopping');
    const pooled = await this.pools.toAdopt();
    const result = await runtime.reconcile(new Set([...live.map((s) => s.id), ...pooled.keys()]));
    const adopted = new Set(result.adopted);
    await this.pools.adopted(pooled, adopted);
    for (const s of records) {
      if (adopted.has(s.id)) {
        const { memoryMiB, cpuMillis, diskMiB } = reservationOf(s.spec.resources);
        const local = { id: s.id, memoryMiB, cpuMillis, diskMiB, expiresAtMs: Infinity, starting: false, ...pauseOf(s) };
        ctx.local.set(local);
        ctx.setExpiry(local, Date.parse(s.expiresAt ?? '') || Infinity);
      } else if (s.state !== 'pending' && s.state !== 'hibernated') {
        // Its container is gone (host rebooted, or the worker died mid-create).
        await registry.transition(s.id, 'failed', { failureReason: s.state === 'creating' ? 'infra_error' : 'lost', detail: 'container not found when the worker host restarted' });
      }
    }
    if (result.removed.length) ctx.log.info({ removed: result.removed }, 'reconcile removed leftovers');
    // Commands that were running when this host went down in a sandbox that is gone: their
    // outcome is unknown. Those of adopted sandboxes ran on in their init: their messages,
    // requeued, are collected from it (OpHandler.resume). Queued ones stay in the inbox.
    const inFlight = (await pendingOps(this.deps.redis, this.nodeId, { includeQueued: false })).flatMap((m) => {
      const op = NodeOp.safeParse(m);
      return op.success && op.data.kind === 'exec' && !adopted.has(op.data.sandboxId) ? [op.data] : [];
    });
    const unknown = await commands.settleUnfinished(inFlight, `its worker host ${this.nodeId} restarted while it ran`, { includeQueued: false });
    if (unknown) ctx.log.warn({ commands: unknown }, 'commands interrupted by the restart marked unknown');
  }

  private async heartbeat(): Promise<void> {
    const { ctx } = this;
    const gatewayReach = this.deps.gatewayReach?.();
    const heartbeat = heartbeatOf({
      nodeId: this.nodeId,
      config: this.deps.config,
      atMs: ctx.now(),
      healthy: !ctx.stopped,
      ready: this.ready,
      syncedLayers: this.deps.syncLayers ? (this.syncedLayers ?? []) : undefined,
      local: ctx.local,
      diskCapacityMiB: ctx.diskSpace().capacityMiB,
      cachedLayers: this.deps.runtime.mountedLayers(),
      network: ctx.networkHealth && { ...ctx.networkHealth, ...(gatewayReach ? { gateway: gatewayReach } : {}) },
      pools: this.pools.status(),
      tiers: this.deps.tiers,
      portRelay: this.portRelay,
      memoryHeld: this.memoryHeld,
    });
    // Read for the next beat: cgroup files, off the beat's own path.
    void this.deps.runtime.memoryHeld().then((held) => (this.memoryHeld = held), () => undefined);
    const added = await this.deps.redis.hset(keys.nodes, this.nodeId, JSON.stringify(heartbeat));
    // Our entry was gone: a janitor declared this host lost (a long stall) and failed its
    // sandboxes. Those must go here too, now rather than at the audit's next round.
    if (added && this.beats++ > 0) {
      ctx.log.warn('this host had been declared lost; comparing its sandboxes with the registry');
      this.audit.requestCompare();
    }
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

  /**
   * One sandbox, checked when its init's channel closed, or by the audit: a dead init ends
   * a tenant's sandbox failed (init_lost or oom) and a warm pool's ready one withdrawn.
   */
  private async checkOne(id: string): Promise<void> {
    const s = this.ctx.local.get(id);
    if (!s || s.starting || this.ctx.stopped) return;
    if (s.pool) await this.pools.dropIfDead(id);
    else await this.ctx.checkAlive(id);
  }

  /**
   * Registry wins: a sandbox that ended while this host could not act on it (declared
   * lost during a long stall, or a delete whose message was lost) is removed here. Two
   * calls (the node's sets), whatever the number of sandboxes.
   */
  private async compareWithRegistry(): Promise<void> {
    const { ctx } = this;
    const running = ctx.local.running();
    if (running.length === 0) return;
    const { live, stopping } = await this.deps.registry.nodeView(this.nodeId);
    for (const { id } of running) {
      if (live.has(id) && !stopping.has(id)) continue;
      // Started or ended meanwhile: only what is still here, as it was, goes.
      if (ctx.local.get(id)?.starting !== false) continue;
      await ctx.removeLocal(id);
      if (stopping.has(id)) await this.deps.registry.transition(id, 'terminated', { node: this.nodeId });
      ctx.log.info({ sandboxId: id, stopping: stopping.has(id) }, 'removed a sandbox the registry no longer keeps running here');
    }
  }
}
