import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { RollboxError, type NodeHeartbeat, type PauseMode, type Reply } from '../api/index.ts';
import type { Config } from '../config/index.ts';
import type { LayerFiles } from '../layers/index.ts';
import { publishReply } from '../queues/index.ts';
import { LayerRegistry, type CommandLog, type SandboxRegistry } from '../registry/index.ts';
import os from 'node:os';
import { diskCapacityMiB, readPressure, type AdmissionState } from './admission.ts';
import { Deadlines } from './deadlines.ts';
import { LocalSandboxes, type LocalSandbox } from './local-sandboxes.ts';
import type { NetworkHealth } from './network/index.ts';
import type { SandboxRuntime } from './runtime/types.ts';

export interface WorkerHostDeps {
  config: Config['node'] & { nodeId: string };
  /** Commands (heartbeats, replies, registry). */
  redis: Redis;
  /** Makes a new connection for the ops inbox (BLMOVE blocks it). */
  connectBlocking: () => Redis;
  /** Makes BullMQ's connection for the create queue's Worker (see src/queues/jobs). */
  connectJobs: () => Redis;
  registry: SandboxRegistry;
  commands: CommandLog;
  runtime: SandboxRuntime;
  /**
   * A layer's files on this host, or undefined when it cannot be had here. On a host without
   * the layer store this fetches what it needs first: the metadata of a lazy layer, or the
   * whole layer (ROLLBOX_LAYER_FETCH=full).
   */
  layerFiles: (digest: string) => Promise<LayerFiles | undefined>;
  /** Moves a freshly built image into the layer store (content-addressed). */
  storeLayerImage: (tmpImagePath: string) => Promise<{ digest: string; sizeBytes: number }>;
  /** Moves a freshly built split layer (metadata image, data blob, chunk table) into the layer store. */
  storeSplitLayer: (files: { metaPath: string; blobPath: string; chunkSizeBytes: number; table: Buffer }) => Promise<{ digest: string; sizeBytes: number }>;
  /** Where a sandbox hibernated whole keeps its image: the layer store's `hibernated/<id>` (LayerStore). */
  hibernatedImageDirOf: (sandboxId: string) => string;
  /** Where a fork that keeps processes keeps its image: the layer store's `vmforks/<fork point id>` (LayerStore). */
  forkImageDirOf: (forkPointId: string) => string;
  /** Scratch space for images being built. */
  tmpDir: string;
  logger: Logger;
  now?: () => number;
  /**
   * A cloud host's layer sync: copies its layer set into its own store and returns the
   * digests held. Runs before the host reports ready; retried until it succeeds.
   */
  syncLayers?: (signal: AbortSignal) => Promise<string[]>;
  /** The chunk cache of lazy layers (a host that fetches what its store lacks), for admission. */
  layerCache?: { committedBytes(): number; readonly limitBytes: number; demandBytes(digests: readonly string[]): Promise<number> };
  /** The tiers beyond container this host runs (heartbeat; placement sends microvm creates only here). */
  tiers?: NodeHeartbeat['tiers'];
  /** The network self-test, ticked at start and every few seconds (see NetworkSelfTest.tick); without it no health is reported. */
  networkSelfTest?: { tick(): Promise<NetworkHealth | undefined>; settled(): Promise<void> };
  /** Where its agent sandboxes reach the gateway, while it has any (SandboxNetworks.gatewayReach), for the heartbeat. */
  gatewayReach?: () => NonNullable<NodeHeartbeat['network']>['gateway'];
}

/** What the worker host's parts (create handling, op handling, the host itself) share. */
const HOST_READINGS_TTL_MS = 100;

export class HostContext {
  readonly local = new LocalSandboxes();
  /** Pins of packed layers (see OpHandler.packWritableLayer). */
  readonly layers: LayerRegistry;
  readonly log: Logger;
  readonly now: () => number;
  /** Running sandboxes' TTLs, each a timer of its own (nothing sweeps them). */
  readonly ttls: Deadlines;
  stopped = false;
  /** The last network self-test's verdict. */
  networkHealth: NetworkHealth | undefined;
  /** Pauses a sandbox whose TTL says `pause` (the op handler's pause or hibernation), to be kept paused until `pausedUntilMs`. */
  pauseAtTtl: ((id: string, mode: PauseMode, pausedUntilMs: number) => Promise<void>) | undefined;
  /** Free memory and pressure as last read (see hostReadings). */
  private readings: { atMs: number; freeMemoryMiB: number; pressure: ReturnType<typeof readPressure> } | undefined;

  constructor(readonly deps: WorkerHostDeps) {
    this.log = deps.logger.child({ nodeId: deps.config.nodeId });
    this.now = deps.now ?? Date.now;
    this.layers = new LayerRegistry(deps.redis);
    this.ttls = new Deadlines((id) => void this.expire(id).catch((err: unknown) => this.log.warn({ err, sandboxId: id }, 'ending an expired sandbox failed')), this.now);
  }

  get nodeId(): string {
    return this.deps.config.nodeId;
  }

  async reply(replyTo: string, reply: Reply): Promise<void> {
    await publishReply(this.deps.redis, replyTo, reply);
  }

  requireLocal(sandboxId: string): void {
    if (!this.local.has(sandboxId)) throw new RollboxError('invalid_state', `sandbox ${sandboxId} is not running on this node`);
  }

  /** Out of the table first: nothing (the init watch, say) may take a sandbox being destroyed for a dead one. */
  async removeLocal(id: string): Promise<void> {
    this.local.delete(id);
    this.ttls.clear(id);
    await this.deps.runtime.destroy(id).catch((err) => this.log.error({ err, sandboxId: id }, 'destroy failed'));
  }

  /** A running sandbox's TTL: it ends `failed(timeout)` at `atMs` (Infinity: never). */
  setExpiry(sandbox: LocalSandbox, atMs: number): void {
    sandbox.expiresAtMs = atMs;
    this.ttls.set(sandbox.id, atMs);
  }

  /** A new TTL for a sandbox this host runs (running or frozen): its timer moves, then its record. */
  async moveExpiry(id: string, atMs: number): Promise<void> {
    const sandbox = this.local.get(id);
    if (!sandbox || sandbox.starting) throw new RollboxError('invalid_state', `sandbox ${id} is not running on this node`);
    this.setExpiry(sandbox, atMs);
    if (!(await this.deps.registry.setExpiresAt(id, new Date(atMs).toISOString()))) throw new RollboxError('invalid_state', `sandbox ${id} ended meanwhile`);
  }

  private async expire(id: string): Promise<void> {
    const s = this.local.get(id);
    if (!s || s.starting || s.pool) return;
    if (s.expiresAtMs > this.now()) return this.ttls.set(id, s.expiresAtMs); // moved later meanwhile
    // E2B's auto-pause: a running sandbox whose TTL says so is paused, not ended, and kept
    // paused for its paused TTL; at that one (or at a TTL it reaches paused) it ends.
    const record = this.pauseAtTtl && (await this.deps.registry.get(id));
    const onTtl = record?.spec.onTtl;
    if (onTtl?.action === 'pause' && record?.state === 'running') {
      try {
        await this.pauseAtTtl!(id, onTtl.mode, this.now() + onTtl.pausedTtlSeconds * 1000);
        return this.log.info({ sandboxId: id, mode: onTtl.mode }, 'ttl reached: paused');
      } catch (err) {
        this.log.warn({ err, sandboxId: id }, 'pausing at the ttl failed; ending the sandbox');
      }
    }
    await this.removeLocal(id);
    await this.deps.registry.transition(id, 'failed', { node: this.nodeId, failureReason: 'timeout', detail: 'ttl expired' });
    this.log.info({ sandboxId: id }, 'ttl expired');
  }

  /**
   * A sandbox whose init died ends failed with the reason its runtime tells (`oom` when the
   * OOM killer took it, `guest_panic` for a microVM whose kernel panicked, else `init_lost`:
   * killed from outside), asked before its remains go. Nothing it ran reports a result any more.
   */
  async checkAlive(id: string): Promise<void> {
    if (!this.local.has(id) || (await this.deps.runtime.isRunning(id)) || !this.local.has(id)) return;
    const exit = await this.deps.runtime.exitCause(id);
    await this.removeLocal(id);
    await this.deps.registry.transition(id, 'failed', { node: this.nodeId, failureReason: exit.reason, detail: exit.detail });
    this.log.warn({ sandboxId: id, reason: exit.reason }, 'sandbox init died');
  }

  /** This host as admission sees it now: capacity, reservations (less `releasing`'s, being replaced), free memory, disk, pressure. */
  admissionState(releasing?: { memoryMiB: number; cpuMillis: number; diskMiB: number }): AdmissionState {
    const { config } = this.deps;
    const readings = this.hostReadings();
    const reserved = this.local.reserved();
    if (releasing) for (const k of ['memoryMiB', 'cpuMillis', 'diskMiB'] as const) reserved[k] -= releasing[k];
    return {
      capacity: config,
      reserved,
      sandboxes: this.local.size - (releasing ? 1 : 0),
      hostFreeMemoryMiB: readings.freeMemoryMiB,
      hostReserveMiB: config.hostReserveMiB,
      disk: this.diskSpace(),
      ...(this.deps.layerCache ? { layerCache: { committedBytes: this.deps.layerCache.committedBytes() + this.local.startingLayerCacheBytes(), limitBytes: this.deps.layerCache.limitBytes } } : {}),
      pressure: { ...readings.pressure, memoryFullMaxPct: config.psi.memoryFullMaxPct, cpuSomeMaxPct: config.psi.cpuSomeMaxPct },
    };
  }

  /**
   * Free memory and PSI, read at most every HOST_READINGS_TTL_MS: a burst of creates would
   * otherwise read /proc/meminfo and two pressure files each. Pressure is a 10 s average and
   * every admitted sandbox's reservation is counted at once, so a reading this old decides
   * the same.
   */
  private hostReadings(): NonNullable<HostContext['readings']> {
    const nowMs = performance.now();
    if (!this.readings || nowMs - this.readings.atMs > HOST_READINGS_TTL_MS) {
      this.readings = { atMs: nowMs, freeMemoryMiB: Math.floor(os.freemem() / 1024 / 1024), pressure: readPressure() };
    }
    return this.readings;
  }

  diskSpace(): { capacityMiB: number; freeMiB: number; sizeMiB: number } {
    const space = this.deps.runtime.diskSpace();
    return { capacityMiB: diskCapacityMiB(space, this.deps.config.diskOvercommit), freeMiB: space.freeMiB, sizeMiB: space.sizeMiB };
  }
}
