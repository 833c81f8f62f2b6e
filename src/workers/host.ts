import { mkdir, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Queue, Worker, type Job } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { CreateJob, NodeOp, RollboxError, isTerminal, type NodeHeartbeat, type Reply, type Sandbox } from '../api/index.ts';
import type { Config } from '../config/index.ts';
import { createQueueName, opsQueueName, publishReply } from '../queues/index.ts';
import { LayerRegistry, OutputWriter, keys, type CommandLog, type SandboxRegistry } from '../registry/index.ts';
import { decideAdmission, diskCapacityMiB } from './admission.ts';
import { readSandboxFiles, writeSandboxFiles } from './files.ts';
import { InitLostError } from './init/index.ts';
import type { SandboxRuntime } from './runtime/types.ts';

export interface WorkerHostDeps {
  config: Config['node'] & { nodeId: string };
  /** Commands (heartbeats, replies, registry). */
  redis: Redis;
  /** Makes a new connection for each BullMQ worker (they block). */
  connectBlocking: () => Redis;
  registry: SandboxRegistry;
  commands: CommandLog;
  runtime: SandboxRuntime;
  /** Absolute path of a layer image on this host, or undefined when it is not available here. */
  layerImagePath: (digest: string) => Promise<string | undefined>;
  /** Moves a freshly built image into the layer store (content-addressed). */
  storeLayerImage: (tmpImagePath: string) => Promise<{ digest: string; sizeBytes: number }>;
  /** Scratch space for images being built. */
  tmpDir: string;
  logger: Logger;
  now?: () => number;
  /**
   * A cloud host's layer sync: copies its layer set into its own store and returns the
   * digests held. Runs before the host reports ready; retried until it succeeds.
   */
  syncLayers?: (signal: AbortSignal) => Promise<string[]>;
}

/** A BullMQ worker plus what the watchdog needs to notice it has stopped fetching. */
interface SupervisedQueue {
  name: string;
  queue: Queue;
  worker: Worker;
  lastJobAtMs: number;
  /** Jobs being processed now: a worker busy with long jobs is not stuck. */
  inFlight: number;
  restart: () => Worker;
}

interface LocalSandbox {
  id: string;
  memoryMiB: number;
  cpuMillis: number;
  diskMiB: number;
  expiresAtMs: number;
  /** Set while a create is in flight; cleared once running. */
  starting: boolean;
}

/** Requests handled recently, reported in heartbeats so gateways can drop assumed load. */
const HANDLED_WINDOW_MS = 15_000;
const OPS_CONCURRENCY = 256;
const REGISTRY_SYNC_MS = 3000;
/** How often the inits of local sandboxes are checked (two small /proc reads each). */
const INIT_WATCH_MS = 2000;
const WATCHDOG_MS = 5000;
/** A queue with waiting jobs that its worker has not touched for this long is stuck. */
const STUCK_AFTER_MS = 15_000;
/** A packed layer is safe from garbage collection this long if its record is never written. */
const LAYER_PIN_MS = 30 * 60_000;
const SYNC_RETRY_MS = 1000;
/**
 * On stop, how long running jobs may finish before the host stops waiting on them. A
 * command can run for hours (a background one up to 24 h): past this, stop goes on, and
 * its sandbox is destroyed (embedded stack) or adopted by the next start, whose reconcile
 * ends commands nobody collects.
 */
const STOP_GRACE_MS = 5000;

/**
 * A worker host: pulls create requests from its own queue under local admission, runs
 * operations on its sandboxes, heartbeats, expires TTLs, and reconciles on start.
 */
export class WorkerHost {
  private readonly local = new Map<string, LocalSandbox>();
  private readonly handled: { sandboxId: string; atMs: number }[] = [];
  /** Stage changes of one sandbox apply in the order they arrived. */
  private readonly policyChanges = new Map<string, Promise<void>>();
  private queueWorkers: SupervisedQueue[] = [];
  private timers: NodeJS.Timeout[] = [];
  private readonly now: () => number;
  private readonly log: Logger;
  /** Pins of packed layers (see packWritableLayer). */
  private readonly layers: LayerRegistry;
  private stopped = false;
  /** False while a cloud host syncs its layers: placement skips it. */
  private ready: boolean;
  private syncedLayers: string[] | undefined;
  private readonly stopping = new AbortController();

  constructor(private readonly deps: WorkerHostDeps) {
    this.ready = !deps.syncLayers;
    this.now = deps.now ?? Date.now;
    this.log = deps.logger.child({ nodeId: deps.config.nodeId });
    this.layers = new LayerRegistry(deps.redis);
  }

  get nodeId(): string {
    return this.deps.config.nodeId;
  }

  async start(): Promise<void> {
    await this.reconcile();
    await this.heartbeat();
    await this.syncLayersBeforeReady();
    if (this.stopped) return;
    const { config } = this.deps;
    this.queueWorkers = [
      this.superviseQueue(createQueueName(config.nodeId), config.maxStarting, (data) => this.handleCreate(CreateJob.parse(data))),
      this.superviseQueue(opsQueueName(config.nodeId), OPS_CONCURRENCY, (data) => this.handleOp(NodeOp.parse(data))),
    ];
    this.timers.push(setInterval(() => void this.watchQueues().catch((err) => this.log.warn({ err }, 'queue watchdog failed')), WATCHDOG_MS));
    this.timers.push(setInterval(() => void this.heartbeat().catch((err) => this.log.warn({ err }, 'heartbeat failed')), config.heartbeatMs));
    this.timers.push(setInterval(() => void this.expireTtls().catch((err) => this.log.warn({ err }, 'ttl sweep failed')), 1000));
    this.timers.push(setInterval(() => void this.syncWithRegistry().catch((err) => this.log.warn({ err }, 'registry sync failed')), REGISTRY_SYNC_MS));
    this.timers.push(setInterval(() => void this.watchInits().catch((err) => this.log.warn({ err }, 'init watch failed')), INIT_WATCH_MS));
    for (const t of this.timers) t.unref();
    this.log.info({ adopted: this.local.size }, 'worker host started');
  }

  /** Heartbeats say `ready: false` until the layer set is in this host's own store. */
  private async syncLayersBeforeReady(): Promise<void> {
    const { syncLayers } = this.deps;
    if (!syncLayers) return;
    const beat = setInterval(() => void this.heartbeat().catch((err) => this.log.warn({ err }, 'heartbeat failed')), this.deps.config.heartbeatMs);
    try {
      while (!this.stopped) {
        try {
          this.syncedLayers = await syncLayers(this.stopping.signal);
          break;
        } catch (err) {
          if (this.stopped) return;
          this.log.warn({ err }, 'layer sync failed; retrying');
          await new Promise((r) => setTimeout(r, SYNC_RETRY_MS));
        }
      }
    } finally {
      clearInterval(beat);
    }
    this.ready = true;
    this.log.info({ layers: this.syncedLayers?.length }, 'layers synced; ready');
    await this.heartbeat();
  }

  /**
   * Stops pulling work. With `destroySandboxes` (the embedded `rollbox up` stack), every
   * local sandbox is also stopped and ends `terminated`; without it they keep running
   * and the next start adopts them.
   */
  async stop(options: { destroySandboxes: boolean }): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    this.stopping.abort();
    for (const t of this.timers) clearInterval(t);
    // Stop fetching, give running jobs the grace, then close without waiting on the rest
    // (BullMQ's close() would wait for them, and a later close(true) returns that same wait).
    await Promise.all(this.queueWorkers.map((q) => q.worker.pause(true)));
    const busy = () => this.queueWorkers.reduce((n, q) => n + q.inFlight, 0);
    const untilIdle = async (ms: number) => {
      for (const until = Date.now() + ms; busy() > 0 && Date.now() < until; ) await new Promise((r) => setTimeout(r, 50));
    };
    await untilIdle(STOP_GRACE_MS);
    if (busy() > 0) this.log.warn({ inFlight: busy() }, 'jobs still running at stop; not waiting for them');
    await Promise.all(this.queueWorkers.map((q) => q.worker.close(q.inFlight > 0)));
    await Promise.all(this.queueWorkers.map((q) => q.queue.close()));
    if (options.destroySandboxes) {
      await Promise.all(
        [...this.local.keys()].map(async (id) => {
          await this.deps.runtime.destroy(id).catch((err) => this.log.error({ err, sandboxId: id }, 'destroy on shutdown failed'));
          await this.deps.registry.transition(id, 'terminated', { node: this.nodeId, detail: 'worker host shut down' });
          this.local.delete(id);
        }),
      );
      await this.deps.runtime.reconcile(new Set());
      await this.deps.redis.hdel(keys.nodes, this.nodeId);
      // Commands cut short by the destroys now finish: let them record their results.
      await untilIdle(STOP_GRACE_MS);
    }
  }

  private superviseQueue(name: string, concurrency: number, handle: (data: unknown) => Promise<void>): SupervisedQueue {
    const supervised = { name, queue: new Queue(name, { connection: this.deps.redis }), lastJobAtMs: this.now(), inFlight: 0 };
    const restart = () => {
      const worker = new Worker(
        name,
        async (job: Job) => {
          supervised.lastJobAtMs = this.now();
          supervised.inFlight++;
          try {
            await handle(job.data);
          } finally {
            supervised.inFlight--;
          }
        },
        { connection: this.deps.connectBlocking(), concurrency, removeOnComplete: { count: 0 }, removeOnFail: { count: 1000 } },
      );
      worker.on('error', (err) => this.log.error({ err, queue: name }, 'queue worker error'));
      return worker;
    };
    return Object.assign(supervised, { restart, worker: restart() });
  }

  /**
   * BullMQ workers have been seen to report running while fetching nothing after a Redis
   * restart or failover (bullmq issues 2964, 4378): recreate one whose queue has waiting
   * jobs it has not touched for a while.
   */
  private async watchQueues(): Promise<void> {
    for (const q of this.queueWorkers) {
      if (this.stopped || q.inFlight > 0 || this.now() - q.lastJobAtMs < STUCK_AFTER_MS) continue;
      if ((await q.queue.getWaitingCount()) === 0) continue;
      this.log.warn({ queue: q.name }, 'queue worker stopped fetching; recreating it');
      const stuck = q.worker;
      q.worker = q.restart();
      q.lastJobAtMs = this.now();
      void stuck.close(true).catch(() => {});
    }
  }

  /** Adopt sandboxes Redis says are ours and still run; remove everything else. */
  private async reconcile(): Promise<void> {
    const ids = await this.deps.registry.sandboxesOfNode(this.nodeId);
    const records = (await Promise.all(ids.map((id) => this.deps.registry.get(id)))).filter((s): s is Sandbox => !!s && !isTerminal(s.state));
    const live = records.filter((s) => s.state === 'running' || s.state === 'paused' || s.state === 'stopping');
    const result = await this.deps.runtime.reconcile(new Set(live.map((s) => s.id)));
    const adopted = new Set(result.adopted);
    for (const s of records) {
      if (adopted.has(s.id)) {
        this.local.set(s.id, { id: s.id, memoryMiB: s.spec.resources.memoryMiB, cpuMillis: s.spec.resources.cpuMillis, diskMiB: s.spec.resources.diskMiB, expiresAtMs: Date.parse(s.expiresAt ?? '') || Infinity, starting: false });
      } else if (s.state !== 'pending' && s.state !== 'hibernated') {
        // Its container is gone (host rebooted, or the worker died mid-create).
        await this.deps.registry.transition(s.id, 'failed', { failureReason: s.state === 'creating' ? 'infra_error' : 'lost', detail: 'container not found when the worker host restarted' });
      }
    }
    if (result.removed.length) this.log.info({ removed: result.removed }, 'reconcile removed leftovers');
    // Commands that were running when this host went down: their outcome is unknown.
    // Queued ones stay: they are still in this node's queue.
    const unknown = await this.deps.commands.settleUnfinished(this.nodeId, { includeQueued: false });
    if (unknown) this.log.warn({ commands: unknown }, 'commands interrupted by the restart marked unknown');
  }

  private async heartbeat(): Promise<void> {
    const cutoff = this.now() - HANDLED_WINDOW_MS;
    while (this.handled.length && this.handled[0]!.atMs < cutoff) this.handled.shift();
    const reserved = this.reserved();
    const { config } = this.deps;
    const heartbeat: NodeHeartbeat = {
      nodeId: this.nodeId,
      pool: config.pool,
      atMs: this.now(),
      healthy: !this.stopped,
      ...(this.deps.syncLayers ? { ready: this.ready, syncedLayers: this.syncedLayers ?? [] } : {}),
      capacity: { cpuMillis: config.cpuMillis, memoryMiB: config.memoryMiB, maxSandboxes: config.maxSandboxes, maxStarting: config.maxStarting, diskMiB: this.diskSpace().capacityMiB },
      used: reserved,
      measured: { cpuLoad: os.loadavg()[0]! / os.availableParallelism(), memoryUsedFraction: 1 - os.freemem() / os.totalmem() },
      sandboxes: this.local.size,
      starting: [...this.local.values()].filter((s) => s.starting).length,
      cachedLayers: this.deps.runtime.mountedLayers(),
      handledCreates: this.handled.map((h) => h.sandboxId),
    };
    await this.deps.redis.hset(keys.nodes, this.nodeId, JSON.stringify(heartbeat));
  }

  private reserved(): { memoryMiB: number; cpuMillis: number; diskMiB: number } {
    let memoryMiB = 0;
    let cpuMillis = 0;
    let diskMiB = 0;
    for (const s of this.local.values()) {
      memoryMiB += s.memoryMiB;
      cpuMillis += s.cpuMillis;
      diskMiB += s.diskMiB;
    }
    return { memoryMiB, cpuMillis, diskMiB };
  }

  private diskSpace(): { capacityMiB: number; freeMiB: number; sizeMiB: number } {
    const space = this.deps.runtime.diskSpace();
    return { capacityMiB: diskCapacityMiB(space, this.deps.config.diskOvercommit), freeMiB: space.freeMiB, sizeMiB: space.sizeMiB };
  }

  private async reply(replyTo: string, reply: Reply): Promise<void> {
    await publishReply(this.deps.redis, replyTo, reply);
  }

  private async handleCreate(job: CreateJob): Promise<void> {
    const { registry, runtime, config } = this.deps;
    const sandbox = await registry.get(job.sandboxId);
    if (!sandbox || sandbox.node !== this.nodeId) return; // re-placed elsewhere or expired
    // pending: a new sandbox; hibernated: one coming back from its packed writable layer.
    if (sandbox.state !== 'pending' && sandbox.state !== 'hibernated') {
      // A redelivered job: answer with what already happened.
      if (sandbox.state === 'running') await this.reply(job.replyTo, { kind: 'created', requestId: job.requestId, nodeId: this.nodeId });
      return;
    }
    const request = { memoryMiB: sandbox.spec.resources.memoryMiB, cpuMillis: sandbox.spec.resources.cpuMillis, diskMiB: sandbox.spec.resources.diskMiB };
    const decision = this.stopped
      ? ({ admit: false, reason: 'worker host stopping' } as const)
      : decideAdmission(
          {
            capacity: config,
            reserved: this.reserved(),
            sandboxes: this.local.size,
            hostFreeMemoryMiB: Math.floor(os.freemem() / 1024 / 1024),
            hostReserveMiB: config.hostReserveMiB,
            disk: this.diskSpace(),
          },
          request,
        );
    this.handled.push({ sandboxId: sandbox.id, atMs: this.now() });
    if (!decision.admit) {
      this.log.info({ sandboxId: sandbox.id, reason: decision.reason }, 'admission refused');
      await this.reply(job.replyTo, { kind: 'refused', requestId: job.requestId, nodeId: this.nodeId, reason: decision.reason });
      return;
    }
    const moved = await registry.transition(sandbox.id, 'creating', { from: ['pending', 'hibernated'], node: this.nodeId });
    if (moved.kind !== 'ok') return; // cancelled or timed out meanwhile
    // A waking sandbox: its spec as of the move, since a stage change to a hibernated
    // sandbox is written only while it is hibernated (registry patchSpec). A new one's
    // spec never changes before it runs.
    const spec = sandbox.state === 'hibernated' ? ((await registry.get(sandbox.id))?.spec ?? sandbox.spec) : sandbox.spec;
    const local: LocalSandbox = { id: sandbox.id, ...request, expiresAtMs: Infinity, starting: true };
    this.local.set(sandbox.id, local);
    try {
      const layerImages = await Promise.all(sandbox.layerDigests.map((digest) => this.layerImage(digest)));
      const hibernated = sandbox.hibernationLayer;
      await runtime.create({
        sandboxId: sandbox.id,
        layerImages,
        restoreUpper: hibernated ? await this.layerImage(hibernated) : undefined,
        resources: spec.resources,
        class: spec.class,
        env: spec.env,
        workdir: spec.workdir,
        hiddenPaths: spec.hiddenPaths,
        network: spec.network,
      });
      const startedAtMs = this.now();
      // A sandbox back from hibernation keeps the TTL it started with.
      local.expiresAtMs = Date.parse(sandbox.expiresAt ?? '') || startedAtMs + sandbox.spec.ttlSeconds * 1000;
      local.starting = false;
      const running = await registry.transition(sandbox.id, 'running', {
        from: ['creating'],
        node: this.nodeId,
        startedAt: new Date(startedAtMs).toISOString(),
        expiresAt: new Date(local.expiresAtMs).toISOString(),
        // Its contents are in the upper dir again; the layer is left to garbage collection.
        hibernationLayer: hibernated ? '' : undefined,
      });
      if (running.kind !== 'ok') {
        // Deleted or failed while starting: undo, and finish a delete that arrived meanwhile.
        await this.removeLocal(sandbox.id);
        await registry.transition(sandbox.id, 'terminated', { from: ['stopping'] });
        await this.reply(job.replyTo, { kind: 'error', requestId: job.requestId, error: { code: 'conflict', message: `sandbox became ${running.kind === 'refused' ? running.current : 'missing'} while starting` } });
        return;
      }
      await this.reply(job.replyTo, { kind: 'created', requestId: job.requestId, nodeId: this.nodeId });
    } catch (err) {
      this.log.error({ err, sandboxId: sandbox.id }, 'create failed');
      await this.removeLocal(sandbox.id);
      const message = err instanceof Error ? err.message : String(err);
      await registry.transition(sandbox.id, 'failed', { failureReason: 'infra_error', detail: message });
      await this.reply(job.replyTo, { kind: 'error', requestId: job.requestId, error: { code: 'internal', message: `sandbox failed to start: ${message}` } });
    }
  }

  private async layerImage(digest: string): Promise<{ digest: string; imagePath: string }> {
    const imagePath = await this.deps.layerImagePath(digest);
    if (!imagePath) throw new RollboxError('internal', `layer ${digest} is not available on node ${this.nodeId}`);
    return { digest, imagePath };
  }

  /** Out of the table first: nothing (the init watch, say) may take a sandbox being destroyed for a dead one. */
  private async removeLocal(id: string): Promise<void> {
    this.local.delete(id);
    await this.deps.runtime.destroy(id).catch((err) => this.log.error({ err, sandboxId: id }, 'destroy failed'));
  }

  private async handleOp(op: NodeOp): Promise<void> {
    try {
      switch (op.kind) {
        case 'exec':
          return await this.runExec(op);
        case 'destroy':
          await this.removeLocal(op.sandboxId);
          await this.deps.registry.transition(op.sandboxId, 'terminated', { node: this.nodeId });
          return await this.reply(op.replyTo, { kind: 'done', requestId: op.requestId });
        case 'snapshot': {
          const stored = await this.packWritableLayer(op.sandboxId, op.requestId, op.exclude);
          return await this.reply(op.replyTo, { kind: 'snapshot', requestId: op.requestId, ...stored });
        }
        case 'hibernate':
          await this.hibernate(op.sandboxId, op.requestId);
          return await this.reply(op.replyTo, { kind: 'done', requestId: op.requestId });
        case 'policy':
          await this.applyPolicy(op);
          return await this.reply(op.replyTo, { kind: 'done', requestId: op.requestId });
        case 'pause':
        case 'resume':
          await this.setPaused(op.sandboxId, op.kind === 'pause');
          return await this.reply(op.replyTo, { kind: 'done', requestId: op.requestId });
        case 'files_read':
          this.requireLocal(op.sandboxId);
          return await this.reply(op.replyTo, await readSandboxFiles(this.deps, op));
        case 'files_write':
          this.requireLocal(op.sandboxId);
          return await this.reply(op.replyTo, await writeSandboxFiles(this.deps, op));
      }
    } catch (err) {
      if (err instanceof InitLostError) {
        await this.checkAlive(op.sandboxId);
        err = new RollboxError('invalid_state', `sandbox ${op.sandboxId}: ${err.message}`);
      }
      const error = err instanceof RollboxError ? { code: err.code, message: err.message } : { code: 'internal', message: err instanceof Error ? err.message : String(err) };
      await this.reply(op.replyTo, { kind: 'error', requestId: op.requestId, error });
    }
  }

  /** One command, once: fenced by the command log, recorded before the reply. */
  private async runExec(op: Extract<NodeOp, { kind: 'exec' }>): Promise<void> {
    const { commands, runtime } = this.deps;
    if (!this.local.has(op.sandboxId)) {
      await commands.abandon(op.sandboxId, op.commandId, this.nodeId);
      throw new RollboxError('invalid_state', `sandbox ${op.sandboxId} is not running on this node`);
    }
    // Fencing: a redelivered job (or one whose command already ran) must not run again.
    if (!(await commands.start(op.sandboxId, op.commandId, op.requestId))) {
      const record = await commands.get(op.sandboxId, op.commandId);
      if (record?.state === 'done' && record.result) await this.reply(op.replyTo, { kind: 'exec', requestId: op.requestId, result: { ...record.result, replayed: true } });
      return;
    }
    const output = op.stream ? new OutputWriter(this.deps.redis, op.sandboxId, op.commandId) : undefined;
    const outcome = await runtime
      .exec(op.sandboxId, {
        argv: op.argv,
        stdin: op.stdin,
        env: op.env,
        cwd: op.cwd,
        timeoutMs: op.timeoutMs,
        outputCapBytes: this.deps.config.execOutputCapBytes,
        onOutput: output && ((stream, chunk) => output.write(stream, chunk)),
        holdBackBesteffort: !op.background,
      })
      .catch(async (err: unknown) => {
        await commands.markUnknown(op.sandboxId, op.commandId, this.nodeId);
        if (!(err instanceof InitLostError)) throw err;
        // The init went away under the command: whatever it did, no result can be trusted.
        await this.checkAlive(op.sandboxId);
        throw new RollboxError('result_unknown', `command ${op.commandId}: ${err.message}; it may or may not have taken effect`);
      });
    const { oomKills, ...reported } = outcome;
    if (oomKills > 0) await this.deps.registry.addOomKills(op.sandboxId, oomKills);
    const result = { ...reported, commandId: op.commandId };
    // Output first, then the result, then the reply: whoever sees the result finds all output.
    await output?.flush();
    await commands.complete(op.sandboxId, this.nodeId, result);
    await this.reply(op.replyTo, { kind: 'exec', requestId: op.requestId, result: { ...result, replayed: false } });
    // A killed command may mean the whole sandbox went down with it.
    if (outcome.exitCode >= 128 || oomKills > 0) await this.checkAlive(op.sandboxId);
  }

  /**
   * Pack the writable layer, then stop the container: its memory goes back to the host.
   * Waking it starts a new container over its layers with that layer copied back into the
   * upper dir, so hibernating again replaces the layer instead of stacking another.
   */
  private async hibernate(sandboxId: string, requestId: string): Promise<void> {
    const sandbox = await this.deps.registry.get(sandboxId);
    if (!sandbox) throw new RollboxError('not_found', `sandbox ${sandboxId} not found`);
    const stored = await this.packWritableLayer(sandboxId, requestId, []);
    await this.removeLocal(sandboxId);
    const moved = await this.deps.registry.transition(sandboxId, 'hibernated', { from: ['running', 'paused'], node: this.nodeId, hibernationLayer: stored.digest });
    await this.layers.unpin(stored.digest);
    if (moved.kind !== 'ok') throw new RollboxError('conflict', `sandbox ${sandboxId} changed state while hibernating`);
    const expiresAtMs = Date.parse(sandbox.expiresAt ?? '');
    if (expiresAtMs) await this.deps.registry.watchHibernatedTtl(sandboxId, expiresAtMs);
  }

  private requireLocal(sandboxId: string): void {
    if (!this.local.has(sandboxId)) throw new RollboxError('invalid_state', `sandbox ${sandboxId} is not running on this node`);
  }

  /** A task stage change: applied here first, then recorded so a wake or an adoption uses it. */
  private async applyPolicy(op: Extract<NodeOp, { kind: 'policy' }>): Promise<void> {
    this.requireLocal(op.sandboxId);
    const previous = this.policyChanges.get(op.sandboxId) ?? Promise.resolve();
    const change = previous.catch(() => undefined).then(async () => {
      const policy = await this.deps.runtime.applyPolicy(op.sandboxId, { network: op.network, hiddenPaths: op.hiddenPaths });
      await this.deps.registry.patchSpec(op.sandboxId, policy);
    });
    this.policyChanges.set(op.sandboxId, change);
    try {
      await change;
    } finally {
      if (this.policyChanges.get(op.sandboxId) === change) this.policyChanges.delete(op.sandboxId);
    }
  }

  private async setPaused(sandboxId: string, paused: boolean): Promise<void> {
    if (!this.local.has(sandboxId)) throw new RollboxError('invalid_state', `sandbox ${sandboxId} is not running on this node`);
    await (paused ? this.deps.runtime.pause(sandboxId) : this.deps.runtime.resume(sandboxId));
    await this.deps.registry.transition(sandboxId, paused ? 'paused' : 'running', { from: [paused ? 'running' : 'paused'], node: this.nodeId });
  }

  private async packWritableLayer(sandboxId: string, requestId: string, exclude: readonly string[]): Promise<{ digest: string; sizeBytes: number }> {
    if (!this.local.has(sandboxId)) throw new RollboxError('invalid_state', `sandbox ${sandboxId} is not running on this node`);
    await mkdir(this.deps.tmpDir, { recursive: true });
    const outPath = path.join(this.deps.tmpDir, `pack-${requestId}.erofs`);
    try {
      await this.deps.runtime.snapshot(sandboxId, { outPath, excludePaths: exclude });
      const stored = await this.deps.storeLayerImage(outPath);
      // Unreferenced until the hibernated sandbox or the snapshot's record names it.
      await this.layers.pin(stored.digest, this.now() + LAYER_PIN_MS);
      return stored;
    } finally {
      await rm(outPath, { force: true });
    }
  }

  /** A sandbox whose init died (OOM of the whole sandbox, or killed from outside) ends failed. */
  private async checkAlive(id: string): Promise<void> {
    if (!this.local.has(id) || (await this.deps.runtime.isRunning(id)) || !this.local.has(id)) return;
    const oom = (await this.deps.runtime.oomKillCount(id)) > 0;
    await this.removeLocal(id);
    await this.deps.registry.transition(id, 'failed', {
      node: this.nodeId,
      failureReason: oom ? 'oom' : 'init_lost',
      detail: oom ? 'the sandbox init was killed by the OOM killer' : 'the sandbox init process died',
    });
    this.log.warn({ sandboxId: id, oom }, 'sandbox init died');
  }

  /** Inits that died while no command ran (killed from the host, say) are noticed here. */
  private async watchInits(): Promise<void> {
    for (const s of [...this.local.values()]) if (!s.starting) await this.checkAlive(s.id);
  }

  /**
   * Registry wins: a sandbox that ended while this host could not act on it (declared
   * lost during a long stall, or a delete whose message was lost) is removed here.
   */
  private async syncWithRegistry(): Promise<void> {
    const ids = [...this.local.values()].filter((s) => !s.starting).map((s) => s.id);
    const states = await this.deps.registry.states(ids);
    for (const [i, state] of states.entries()) {
      const id = ids[i]!;
      if (state !== undefined && !isTerminal(state) && state !== 'stopping') continue;
      await this.removeLocal(id);
      if (state === 'stopping') await this.deps.registry.transition(id, 'terminated', { node: this.nodeId });
      this.log.info({ sandboxId: id, state }, 'removed a sandbox the registry no longer keeps running here');
    }
  }

  private async expireTtls(): Promise<void> {
    const now = this.now();
    for (const s of [...this.local.values()]) {
      if (s.starting || s.expiresAtMs > now) continue;
      await this.removeLocal(s.id);
      await this.deps.registry.transition(s.id, 'failed', { node: this.nodeId, failureReason: 'timeout', detail: 'ttl expired' });
      this.log.info({ sandboxId: s.id }, 'ttl expired');
    }
  }
}
