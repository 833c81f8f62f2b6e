import { mkdir, utimes } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { RollboxError } from '../../api/index.ts';
import type { LazyBlobHolder } from '../mounts.ts';
import type { LayerFiles } from '../store.ts';
import { cachedHexes, committedBytesOf, demandBytesOf, ensureData, evictPastLimit, isComplete, layerPaths, presenceOf, removeLayerFiles, removeTemporaries, usedBytesOf } from './cache-files.ts';
import type { OriginOptions } from './fetcher.ts';
import { ChunkFiller } from './filler.ts';
import { GateClient, type GateHello } from './gate.ts';
import { loadLayerMetadata } from './metadata.ts';
import { PrefetchRecorder } from './prefetch-recorder.ts';
import type { CachedLayer, LayerPaths, LazyLayersDeps } from './types.ts';

export type { LazyLayersDeps, LazyLayersLogger, PrefetchStore } from './types.ts';

const UNSAFE_WAIT_MS = 10_000;

/**
 * A worker host's lazy layers: the layers it lacks are mounted as soon as their metadata is
 * local, and their data chunks are fetched on first read. One chunk cache per host, shared by
 * every sandbox on it; it survives worker restarts (the gate, a detached process, keeps the
 * blobs marked, and each blob's map says which chunks are written), so nothing cached is
 * fetched again. The pieces: the gate (rollbox-gate.c: fanotify, writes, answers; gate.ts),
 * the chunk filler (filler.ts, fetcher.ts: range requests, checked per chunk), the cache's
 * files (cache-files.ts, metadata.ts), prefetch lists (prefetch-recorder.ts), and this class,
 * which holds the per-layer state they share.
 */
export class LazyLayers implements LazyBlobHolder {
  private readonly layers = new Map<string, CachedLayer>();
  private readonly loading = new Map<string, Promise<CachedLayer | undefined>>();
  private readonly gate: GateClient;
  private readonly filler: ChunkFiller;
  private readonly recorder: PrefetchRecorder;
  private stopped = false;
  /** Blobs the gate held when this process first reached it. */
  private readonly heldAtStart = new Set<string>();
  private reachedGate = false;
  /** Layers mounted on this host (LayerMounts' attach and detach), and how many microVMs read each (hold, release). */
  private readonly mountHeld = new Set<string>();
  private readonly vmHolds = new Map<string, number>();
  private reconnecting: Promise<void> | undefined;
  private limiting: Promise<unknown> = Promise.resolve();
  /** Bytes read from the origin since start (chunks, metadata, tables). */
  fetchedBytes = 0;

  constructor(private readonly deps: LazyLayersDeps) {
    this.gate = new GateClient({
      dir: deps.gateDir,
      gateBinary: deps.gateBinary,
      graceMs: deps.graceMs,
      eventTimeoutMs: deps.eventTimeoutMs,
      onNeed: (id, first, count) => void this.need(id, first, count),
      onLost: (err) => this.gateLost(err),
    });
    this.recorder = new PrefetchRecorder(deps.prefetchStore, deps.prefetchWindowMs ?? 120_000, deps.logger);
    this.filler = new ChunkFiller({ gate: this.gate, layerOf: (hex) => this.layers.get(`sha256:${hex}`), origin: () => this.origin, concurrency: deps.concurrency, readaheadChunks: deps.readaheadChunks ?? 0, logger: deps.logger });
  }

  private get origin(): OriginOptions {
    return { ...this.deps.origin, onBytes: (n) => (this.fetchedBytes += n) };
  }

  /** Reaches the gate (starting one, which takes over from a keeper a dead gate left) and learns what it holds. */
  async start(): Promise<void> {
    await mkdir(this.deps.cacheDir, { recursive: true, mode: 0o700 });
    // Leftovers of a metadata fetch a previous process did not finish (only then: one under
    // way now writes its own).
    await removeTemporaries(this.deps.cacheDir);
    await this.afterHello(await this.gate.connect());
  }

  /** The gate's pid and its keeper's (tests and operators look at them). */
  gateProcess(): { pid: number; keeperPid: number } | undefined {
    const h = this.gate.hello;
    return h && { pid: h.pid, keeperPid: h.keeperPid };
  }

  /** What the gate holds decides which layers are attached (after a worker restart, or a new gate). */
  private async afterHello(hello: GateHello): Promise<void> {
    const held = new Map((await this.gate.list()).map((b) => [b.id, b]));
    if (!this.reachedGate) for (const id of held.keys()) this.heldAtStart.add(id);
    this.reachedGate = true;
    const unsafe: string[] = [];
    for (const l of this.layers.values()) {
      if (!l.attached || held.has(l.hex)) continue;
      l.attached = false;
      if (!isComplete(l)) {
        l.unsafe = true;
        unsafe.push(l.digest);
      }
    }
    for (const id of held.keys()) {
      const known = this.layers.get(`sha256:${id}`);
      // Let go of while the gate was away (taken over since): let go of now.
      if (known && !known.attached) {
        await this.gate.detach(id).catch(() => undefined);
        continue;
      }
      // A worker's first contact: what the gate holds is what the last worker mounted (the reconcile that follows settles it).
      const layer = known ?? (await this.load(`sha256:${id}`).catch(() => undefined));
      if (layer) layer.attached = true;
      else await this.gate.detach(id).catch(() => undefined);
    }
    this.deps.logger?.info({ gatePid: hello.pid, keeperPid: hello.keeperPid, tookOver: hello.tookOver, blobs: held.size }, 'lazy layers: gate connected');
    if (unsafe.length) {
      this.deps.logger?.warn({ layers: unsafe }, 'lazy layers: the gate lost these blobs (gate and keeper died); failing their sandboxes');
      await this.deps.onUnsafe?.(unsafe);
    }
  }

  private gateLost(err: Error): void {
    if (this.stopped) return;
    this.deps.logger?.warn({ err: err.message }, 'lazy layers: gate connection lost; reconnecting');
    this.reconnecting ??= (async () => {
      while (!this.stopped) {
        try {
          await this.afterHello(await this.gate.connect());
          return;
        } catch (e) {
          this.deps.logger?.warn({ err: String(e) }, 'lazy layers: gate not reachable yet');
          await sleep(200);
        }
      }
    })().finally(() => (this.reconnecting = undefined));
  }

  private pathsOf(hex: string): LayerPaths {
    return layerPaths(this.deps.cacheDir, hex);
  }

  /** A layer whose metadata is in the cache (read back, or fetched now); undefined: a single-image layer, which has none. */
  private load(digest: string): Promise<CachedLayer | undefined> {
    const known = this.layers.get(digest);
    if (known) return Promise.resolve(known);
    let p = this.loading.get(digest);
    if (!p) {
      p = this.loadOrFetch(digest).finally(() => this.loading.delete(digest));
      this.loading.set(digest, p);
    }
    return p;
  }

  private async loadOrFetch(digest: string): Promise<CachedLayer | undefined> {
    const layer = await loadLayerMetadata(digest, this.deps.cacheDir, this.origin);
    if (layer) this.layers.set(digest, layer);
    return layer;
  }

  /**
   * The files a mount of this layer needs, fetching its metadata first if the cache lacks
   * it. Undefined: a single-image layer (no metadata to split off: the caller copies it whole).
   */
  async files(digest: string): Promise<LayerFiles | undefined> {
    const layer = await this.load(digest);
    if (!layer) return undefined;
    // Its old mount goes first (the sandboxes on it are being failed): then it is mounted afresh.
    for (const until = Date.now() + UNSAFE_WAIT_MS; layer.unsafe && Date.now() < until; ) await sleep(50);
    if (layer.unsafe) throw new RollboxError('unavailable', `layer ${digest} is being remounted on this host (its gate was lost)`, 1);
    return { digest, imagePath: layer.metaPath, blobPath: layer.dataPath, lazy: true };
  }

  /** LazyBlobHolder: before the first mount, the gate opens the blob and marks it. */
  async attach(files: LayerFiles): Promise<void> {
    this.mountHeld.add(files.digest);
    await this.markBlob(files.digest);
  }

  /**
   * A microVM reads this layer's blob (QEMU's virtio-blk opens the same sparse file): its
   * reads are gated like a mount's, but only if QEMU opens it after the mark (fanotify gives
   * pre-content events to files opened while a mark is there), so this comes first. Each VM
   * holds it once; the blob stays marked while any mount or VM needs it.
   */
  async hold(digest: string): Promise<void> {
    this.vmHolds.set(digest, (this.vmHolds.get(digest) ?? 0) + 1);
    try {
      await this.files(digest);
      await this.markBlob(digest);
    } catch (err) {
      await this.release(digest);
      throw err;
    }
  }

  /** A microVM that held this layer is gone (QEMU ended). */
  async release(digest: string): Promise<void> {
    const n = (this.vmHolds.get(digest) ?? 0) - 1;
    if (n > 0) return void this.vmHolds.set(digest, n);
    this.vmHolds.delete(digest);
    if (!this.mountHeld.has(digest)) await this.letGo(digest);
  }

  private async markBlob(digest: string): Promise<void> {
    const layer = await this.load(digest);
    if (!layer) throw new RollboxError('internal', `layer ${digest} has no chunk table in the cache`);
    if (layer.attached) return;
    ensureData(layer);
    if (!this.gate.connected) await (this.reconnecting ?? this.gate.connect().then((h) => this.afterHello(h)));
    await this.gate.attach(layer.hex, layer.table.blob.sizeBytes, layer.table.chunkSizeBytes, layer.dataPath, layer.mapPath);
    layer.attached = true;
    layer.unsafe = false;
    if (this.deps.prefetch !== 'off') void this.afterAttach(layer).catch((err: unknown) => this.deps.logger?.warn({ digest: layer.digest, err: String(err) }, 'prefetch failed'));
  }

  /**
   * A layer this host holds nothing of: with a prefetch list (and `on`), the list is filled;
   * without one, this is one of its first runs, whose reads are recorded. A host that fills a
   * list records nothing: its reads no longer ask for what the list brought.
   */
  private async afterAttach(layer: CachedLayer): Promise<void> {
    const fresh = !presenceOf(layer).includes(1);
    const list = this.deps.prefetch === 'on' ? ((await this.deps.prefetchStore?.chunks(layer.digest)) ?? []) : [];
    if (list.length) await this.filler.prefetch(layer, list);
    else if (fresh) this.recorder.startRun(layer.digest);
  }

  /** LazyBlobHolder: after the last unmount. */
  async detach(digest: string): Promise<void> {
    this.mountHeld.delete(digest);
    if (!this.vmHolds.has(digest)) await this.letGo(digest);
  }

  private async letGo(digest: string): Promise<void> {
    const layer = this.layers.get(digest);
    if (!layer) return;
    layer.unsafe = false;
    if (!layer.attached) return;
    layer.attached = false;
    // The gate syncs a blob before it lets go of it: its map says everything delivered.
    layer.delivered.clear();
    layer.lastUsedMs = Date.now();
    const at = new Date(layer.lastUsedMs);
    await utimes(layer.tablePath, at, at).catch(() => undefined);
    if (this.gate.connected) await this.gate.detach(layer.hex).catch(() => undefined);
    await this.enforceLimit();
  }

  /** LazyBlobHolder: a mount left by a previous worker is adoptable if the gate kept its blob (or it is complete). */
  async canAdopt(digest: string): Promise<boolean> {
    const layer = await this.load(digest).catch(() => undefined);
    return !!layer && (this.heldAtStart.has(layer.hex) || isComplete(layer));
  }

  /** LazyBlobHolder: after reconciling mounts, the blobs of layers no longer mounted are let go. */
  async reconcile(mounted: ReadonlySet<string>): Promise<void> {
    for (const l of this.layers.values()) if (l.attached && !mounted.has(l.digest)) await this.detach(l.digest);
    for (const digest of mounted) this.mountHeld.add(digest);
  }

  /** The gate asks for chunks a read waits on. */
  private async need(hex: string, first: number, count: number): Promise<void> {
    const layer = await this.load(`sha256:${hex}`).catch(() => undefined);
    if (!layer) return this.filler.refuse(hex, first, count);
    const read = this.filler.demand(hex, first, count);
    if (this.deps.prefetch !== 'off') this.recorder.note(layer.digest, read.first, read.count);
  }

  /** Fills the layer's prefetch list (chunks earlier runs read) that the cache lacks; resolves when done. */
  async prefetch(layer: CachedLayer | string): Promise<void> {
    const l = typeof layer === 'string' ? await this.load(layer) : layer;
    if (!l || !this.deps.prefetchStore) return;
    await this.filler.prefetch(l, await this.deps.prefetchStore.chunks(l.digest));
  }

  /**
   * A cloud host's pre-sync of a layer: its metadata in the cache and its prefetch list
   * filled (the blob attached to the gate meanwhile, then let go). False: a single-image layer.
   */
  async presync(digest: string): Promise<boolean> {
    const files = await this.files(digest);
    if (!files) return false;
    const layer = this.layers.get(digest)!;
    if (this.deps.prefetch !== 'on' || !this.deps.prefetchStore || (await this.deps.prefetchStore.chunks(digest)).length === 0) return true;
    const wasAttached = layer.attached;
    if (!wasAttached) await this.attach(files);
    try {
      await this.prefetch(layer);
    } finally {
      if (!wasAttached) await this.detach(digest);
    }
    return true;
  }

  /**
   * Admission's figures: what the mounted lazy layers may still grow to (each to its whole
   * blob: every chunk could be read), and what a new sandbox's layers would add.
   */
  committedBytes(): number {
    return committedBytesOf(this.layers.values());
  }

  get limitBytes(): number {
    return this.deps.limitBytes;
  }

  /** Bytes the cache would have to take for these layers (those not mounted here yet). */
  demandBytes(digests: readonly string[]): Promise<number> {
    return demandBytesOf(this.layers, digests, this.deps.layerSizeBytes);
  }

  /** Bytes the cache takes on disk now (allocated blocks: the blobs are sparse). */
  usedBytes(): Promise<number> {
    return usedBytesOf(this.deps.cacheDir);
  }

  /**
   * Past the limit: the data of the least recently used layers no mount needs goes (their
   * metadata stays). One pass at a time: two at once would each count the other's victims
   * as still there and evict more than needed.
   */
  enforceLimit(): Promise<string[]> {
    const pass = this.limiting.then(() => evictPastLimit(this.layers.values(), this.deps.cacheDir, this.deps.limitBytes, this.deps.logger));
    this.limiting = pass.catch(() => undefined);
    return pass;
  }

  /** Garbage collection: every file of a layer the cluster forgot (and no mount holds). Returns the digests removed. */
  async collect(): Promise<string[]> {
    const removed: string[] = [];
    for (const hex of await cachedHexes(this.deps.cacheDir)) {
      const digest = `sha256:${hex}`;
      if (this.layers.get(digest)?.attached || this.loading.has(digest)) continue;
      if (!this.deps.layerKnown || (await this.deps.layerKnown(digest))) continue;
      await removeLayerFiles(this.pathsOf(hex));
      this.layers.delete(digest);
      removed.push(digest);
    }
    if (removed.length) this.deps.logger?.info({ layers: removed }, 'lazy layers: removed the cache files of deleted layers');
    return removed;
  }

  /** Chunks of a layer the cache holds (tests, figures). */
  presentChunks(digest: string): number {
    const l = this.layers.get(digest);
    return l ? presenceOf(l).filter((b) => b === 1).length : 0;
  }

  /**
   * Stops fetching and closes the connection; the gate stays for a restarted worker. With
   * `shutdownGate` (nothing is mounted any more) the gate and its keeper end too.
   */
  async stop(options: { shutdownGate: boolean }): Promise<void> {
    this.stopped = true;
    await this.recorder.flush();
    if (options.shutdownGate && this.gate.connected && !(await this.gate.shutdown())) {
      this.deps.logger?.warn({}, 'lazy layers: the gate still holds blobs; left running');
    }
    this.gate.close();
  }
}
