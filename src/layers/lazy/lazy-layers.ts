// Longer than most: one per-layer map is shared by the gate's callbacks (need, lost), the
// cache's files (attach, reconcile, evict, collect) and admission figures; split, each part
// would reach into the others' state.
import { closeSync, existsSync, ftruncateSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { mkdir, readdir, rename, rm, stat, utimes, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { createHash, randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { RollboxError, type LayerChunkTable } from '../../api/index.ts';
import { hexOfDigest } from '../digest.ts';
import type { LazyBlobHolder } from '../mounts.ts';
import { chunkCountOf, parseChunkTable } from '../split.ts';
import type { LayerFiles } from '../store.ts';
import { getLayerFile } from '../sync.ts';
import { FillQueue, fetchChunks, type FillJob, type OriginOptions } from './fetcher.ts';
import { GateClient, type GateHello } from './gate.ts';

/** Chunk lists of layers, recorded from the first runs that read them (see PrefetchLists in src/registry). */
export interface PrefetchStore {
  chunks(digest: string): Promise<number[]>;
  record(digest: string, chunks: readonly number[]): Promise<void>;
}

export interface LazyLayersLogger {
  warn(obj: object, msg?: string): void;
  info(obj: object, msg?: string): void;
}

export interface LazyLayersDeps {
  /** The host's chunk cache: `<hex>.chunks`, `.meta`, `.data` (sparse blob), `.map` (one byte per chunk). */
  cacheDir: string;
  /** The gate's sockets, lock and log. */
  gateDir: string;
  gateBinary?: string;
  origin: Omit<OriginOptions, 'onBytes'>;
  /** The cache's size: past it, the least recently used layers no mount needs lose their data. */
  limitBytes: number;
  /** See GateClientDeps. */
  graceMs: number;
  eventTimeoutMs: number;
  /** Range requests at once. */
  concurrency: number;
  /** `record`: note the chunks first runs read; `on`: also fill them ahead on later mounts. */
  prefetch: 'off' | 'record' | 'on';
  prefetchStore?: PrefetchStore;
  /** Whether the cluster still knows a layer (a forgotten one's files are removed). */
  layerKnown?: (digest: string) => Promise<boolean>;
  /** A layer's size as the cluster records it (before its chunk table is here). */
  layerSizeBytes?: (digest: string) => Promise<number | undefined>;
  /**
   * The gate came back without the blobs of these mounted, incomplete layers (it died
   * together with its keeper): their unread chunks can no longer be guarded, so the sandboxes
   * using them must end before they read again.
   */
  onUnsafe?: (digests: string[]) => Promise<void>;
  logger?: LazyLayersLogger;
}

interface CachedLayer {
  digest: string;
  hex: string;
  table: LayerChunkTable;
  tablePath: string;
  metaPath: string;
  dataPath: string;
  mapPath: string;
  attached: boolean;
  lastUsedMs: number;
  /** A mounted layer the gate no longer guards (see onUnsafe): not handed out until unmounted. */
  unsafe?: boolean;
  /** Chunks a request is fetching now. */
  fetching: Set<number>;
  /** Chunks handed to the gate while attached (its map says so only once they are synced, a moment later). */
  delivered: Set<number>;
}

/** Fetched chunk runs are at most this long (one range request). */
const MAX_RUN_BYTES = 16 * 1024 * 1024;
/**
 * A prefetch is one range request of at most this, one at a time: on a shared link, reads
 * that wait get their turn between them.
 */
const PREFETCH_RUN_BYTES = 4 * 1024 * 1024;
const PREFETCH_CONCURRENCY = 1;
const RECORD_FLUSH_MS = 1000;
const EIO = 5;

const UNSAFE_WAIT_MS = 10_000;

/**
 * A worker host's lazy layers: the layers it lacks are mounted as soon as their metadata is
 * local, and their data chunks are fetched on first read. One chunk cache per host, shared by
 * every sandbox on it; it survives worker restarts (the gate, a detached process, keeps the
 * blobs marked, and each blob's map says which chunks are written), so nothing cached is
 * fetched again. The pieces: the gate (rollbox-gate.c: fanotify, writes, answers), the fill
 * queue (fetcher.ts: range requests, checked per chunk), and this class, which keeps the
 * cache's files, admission figures, size limit, garbage collection and prefetch lists.
 */
export class LazyLayers implements LazyBlobHolder {
  private readonly layers = new Map<string, CachedLayer>();
  private readonly loading = new Map<string, Promise<CachedLayer | undefined>>();
  private readonly gate: GateClient;
  private readonly fills: FillQueue;
  private readonly toRecord = new Map<string, Set<number>>();
  private recordTimer: NodeJS.Timeout | undefined;
  private stopped = false;
  /** Blobs the gate held when this process first reached it. */
  private readonly heldAtStart = new Set<string>();
  private reachedGate = false;
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
    this.fills = new FillQueue({ concurrency: deps.concurrency, prefetchConcurrency: PREFETCH_CONCURRENCY, maxRunBytes: MAX_RUN_BYTES, maxPrefetchRunBytes: PREFETCH_RUN_BYTES, chunkBytesOf: (hex) => this.layers.get(`sha256:${hex}`)?.table.chunkSizeBytes ?? 1 << 20, run: (job) => this.fill(job) });
  }

  private get origin(): OriginOptions {
    return { ...this.deps.origin, onBytes: (n) => (this.fetchedBytes += n) };
  }

  /** Reaches the gate (starting one, which takes over from a keeper a dead gate left) and learns what it holds. */
  async start(): Promise<void> {
    await mkdir(this.deps.cacheDir, { recursive: true, mode: 0o700 });
    // Leftovers of a metadata fetch a previous process did not finish (only then: one under
    // way now writes its own).
    for (const n of await readdir(this.deps.cacheDir)) if (n.includes('.tmp-')) await rm(path.join(this.deps.cacheDir, n), { force: true });
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
      if (!this.complete(l)) {
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

  private pathsOf(hex: string): Pick<CachedLayer, 'tablePath' | 'metaPath' | 'dataPath' | 'mapPath'> {
    const base = path.join(this.deps.cacheDir, hex);
    return { tablePath: `${base}.chunks`, metaPath: `${base}.meta`, dataPath: `${base}.data`, mapPath: `${base}.map` };
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
    const hex = hexOfDigest(digest);
    const paths = this.pathsOf(hex);
    let tableBytes = existsSync(paths.metaPath) ? readQuiet(paths.tablePath) : undefined;
    let table: LayerChunkTable;
    if (tableBytes) {
      table = parseChunkTable(tableBytes, digest);
    } else {
      const response = await getLayerFile(digest, 'chunks', this.origin, { missingOk: true });
      if (!response) return undefined;
      tableBytes = Buffer.from(await response.arrayBuffer());
      this.fetchedBytes += tableBytes.length;
      table = parseChunkTable(tableBytes, digest);
      const meta = Buffer.from(await (await getLayerFile(digest, 'meta', this.origin))!.arrayBuffer());
      this.fetchedBytes += meta.length;
      if (createHash('sha256').update(meta).digest('hex') !== table.meta.sha256) throw new RollboxError('invalid_layer', `layer ${digest}: its metadata image from the origin does not match its chunk table`);
      // The table last: a layer is in the cache once its table is.
      await writeAtomically(paths.metaPath, meta);
      await writeAtomically(paths.tablePath, tableBytes);
    }
    const mtime = await stat(paths.tablePath).then((s) => s.mtimeMs, () => Date.now());
    const layer: CachedLayer = { digest, hex, table, ...paths, attached: false, lastUsedMs: mtime, fetching: new Set(), delivered: new Set() };
    this.layers.set(digest, layer);
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

  private presence(layer: CachedLayer): Buffer {
    return readQuiet(layer.mapPath) ?? Buffer.alloc(0);
  }

  /** Here already: in the map, or delivered to the gate, or on its way. */
  private isHere(layer: CachedLayer, map: Buffer, i: number): boolean {
    return map[i] === 1 || layer.delivered.has(i) || layer.fetching.has(i);
  }

  private complete(layer: CachedLayer): boolean {
    const map = this.presence(layer);
    return map.length === layer.table.chunks.length && !map.includes(0);
  }

  /** The sparse blob and its map, made if the cache has none (first use, or evicted). */
  private ensureData(layer: CachedLayer): void {
    const n = chunkCountOf(layer.table.blob.sizeBytes, layer.table.chunkSizeBytes);
    const ok = existsSync(layer.dataPath) && existsSync(layer.mapPath) && this.presence(layer).length === n;
    if (ok) return;
    // Made fresh together: a map without its data (or data without its map) says nothing true.
    for (const p of [layer.mapPath, layer.dataPath]) rmSync(p, { force: true });
    const fd = openSync(layer.dataPath, 'wx', 0o600);
    try {
      ftruncateSync(fd, layer.table.blob.sizeBytes);
    } finally {
      closeSync(fd);
    }
    writeFileSync(layer.mapPath, Buffer.alloc(n), { mode: 0o600 });
  }

  /** LazyBlobHolder: before the first mount, the gate opens the blob and marks it. */
  async attach(files: LayerFiles): Promise<void> {
    const layer = await this.load(files.digest);
    if (!layer) throw new RollboxError('internal', `layer ${files.digest} has no chunk table in the cache`);
    if (layer.attached) return;
    this.ensureData(layer);
    if (!this.gate.connected) await (this.reconnecting ?? this.gate.connect().then((h) => this.afterHello(h)));
    await this.gate.attach(layer.hex, layer.table.blob.sizeBytes, layer.table.chunkSizeBytes, layer.dataPath, layer.mapPath);
    layer.attached = true;
    layer.unsafe = false;
    if (this.deps.prefetch === 'on') void this.prefetch(layer).catch((err: unknown) => this.deps.logger?.warn({ digest: layer.digest, err: String(err) }, 'prefetch failed'));
  }

  /** LazyBlobHolder: after the last unmount. */
  async detach(digest: string): Promise<void> {
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
    return !!layer && (this.heldAtStart.has(layer.hex) || this.complete(layer));
  }

  /** LazyBlobHolder: after reconciling mounts, the blobs of layers no longer mounted are let go. */
  async reconcile(mounted: ReadonlySet<string>): Promise<void> {
    for (const l of this.layers.values()) if (l.attached && !mounted.has(l.digest)) await this.detach(l.digest);
  }

  /** The gate asks for chunks a read waits on. */
  private async need(hex: string, first: number, count: number): Promise<void> {
    const layer = await this.load(`sha256:${hex}`).catch(() => undefined);
    if (!layer) {
      this.gate.fail(hex, first, count, EIO);
      return;
    }
    if (this.deps.prefetch !== 'off') this.noteRead(layer.digest, first, count);
    // Only what the read needs: fetching ahead (4 MiB past reads that continued a run) fetched
    // twice the bytes in the chunk-size sweep and made the reads slower, not faster.
    this.fills.push({ hex, first, count, demand: true });
  }

  private async fill(job: FillJob): Promise<void> {
    const layer = this.layers.get(`sha256:${job.hex}`);
    if (!layer || !layer.attached) {
      if (job.demand) this.gate.fail(job.hex, job.first, job.count, EIO);
      return;
    }
    // Chunks being fetched by another request are not fetched again, nor (a prefetch) those here already.
    // The gate asks only for what it lacks: a read's chunks are fetched even if delivered before (a new gate).
    const map = this.presence(layer);
    const skip = (i: number) => layer.fetching.has(i) || (!job.demand && this.isHere(layer, map, i));
    let first = job.first;
    let end = job.first + job.count;
    while (first < end && skip(first)) first++;
    while (end > first && skip(end - 1)) end--;
    if (first === end) return;
    for (let i = first; i < end; i++) layer.fetching.add(i);
    let chunks: Buffer[];
    try {
      chunks = await fetchChunks(layer.digest, layer.table, first, end - first, this.origin);
    } catch (err) {
      this.deps.logger?.warn({ digest: layer.digest, first: job.first, count: job.count, err: String(err) }, 'lazy layers: fetching chunks failed; their reads get EIO');
      this.gate.fail(job.hex, job.first, job.count, EIO);
      return;
    } finally {
      for (let i = first; i < end; i++) layer.fetching.delete(i);
    }
    await Promise.all(
      chunks.map((bytes, i) =>
        this.gate.data(job.hex, first + i, bytes).then(
          () => layer.delivered.add(first + i),
          (err: unknown) => this.deps.logger?.warn({ digest: layer.digest, chunk: first + i, err: String(err) }, 'lazy layers: the gate did not write a chunk'),
        ),
      ),
    );
  }

  /** Fills the layer's prefetch list (chunks earlier runs read) that the cache lacks; resolves when done. */
  async prefetch(layer: CachedLayer | string): Promise<void> {
    const l = typeof layer === 'string' ? await this.load(layer) : layer;
    if (!l || !this.deps.prefetchStore) return;
    const wanted = (await this.deps.prefetchStore.chunks(l.digest)).filter((i) => Number.isInteger(i) && i >= 0 && i < l.table.chunks.length).sort((a, b) => a - b);
    const map = this.presence(l);
    const missing = wanted.filter((i) => !this.isHere(l, map, i));
    for (const run of runsOf(missing, Math.max(1, Math.floor(PREFETCH_RUN_BYTES / l.table.chunkSizeBytes)))) this.fills.push({ hex: l.hex, first: run.first, count: run.count, demand: false });
    await this.fills.idle();
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

  private noteRead(digest: string, first: number, count: number): void {
    const set = this.toRecord.get(digest) ?? new Set<number>();
    for (let i = first; i < first + count; i++) set.add(i);
    this.toRecord.set(digest, set);
    this.recordTimer ??= setTimeout(() => void this.flushRecords(), RECORD_FLUSH_MS);
  }

  private async flushRecords(): Promise<void> {
    this.recordTimer = undefined;
    const batch = [...this.toRecord];
    this.toRecord.clear();
    for (const [digest, chunks] of batch) await this.deps.prefetchStore?.record(digest, [...chunks]).catch((err: unknown) => this.deps.logger?.warn({ digest, err: String(err) }, 'recording a prefetch list failed'));
  }

  /**
   * Admission's figures: what the mounted lazy layers may still grow to (each to its whole
   * blob: every chunk could be read), and what a new sandbox's layers would add.
   */
  committedBytes(): number {
    let sum = 0;
    for (const l of this.layers.values()) sum += l.table.meta.sizeBytes + (l.attached ? l.table.blob.sizeBytes : 0);
    return sum;
  }

  get limitBytes(): number {
    return this.deps.limitBytes;
  }

  /** Bytes the cache would have to take for these layers (those not mounted here yet). */
  async demandBytes(digests: readonly string[]): Promise<number> {
    let sum = 0;
    for (const digest of new Set(digests)) {
      const known = this.layers.get(digest);
      if (known) sum += known.attached ? 0 : known.table.blob.sizeBytes;
      else sum += (await this.deps.layerSizeBytes?.(digest)) ?? 0;
    }
    return sum;
  }

  /** Bytes the cache takes on disk now (allocated blocks: the blobs are sparse). */
  async usedBytes(): Promise<number> {
    let sum = 0;
    for (const name of await readdir(this.deps.cacheDir).catch(() => [] as string[])) {
      sum += await stat(path.join(this.deps.cacheDir, name)).then((s) => s.blocks * 512, () => 0);
    }
    return sum;
  }

  /**
   * Past the limit: the data of the least recently used layers no mount needs goes (their
   * metadata stays). One pass at a time: two at once would each count the other's victims
   * as still there and evict more than needed.
   */
  enforceLimit(): Promise<string[]> {
    const pass = this.limiting.then(() => this.evictPastLimit());
    this.limiting = pass.catch(() => undefined);
    return pass;
  }

  private async evictPastLimit(): Promise<string[]> {
    let used = await this.usedBytes();
    const evicted: string[] = [];
    if (used <= this.deps.limitBytes) return evicted;
    const candidates = [...this.layers.values()].filter((l) => !l.attached && existsSync(l.dataPath)).sort((a, b) => a.lastUsedMs - b.lastUsedMs);
    for (const l of candidates) {
      if (used <= this.deps.limitBytes) break;
      const freed = (await stat(l.dataPath).then((s) => s.blocks * 512, () => 0)) + (await stat(l.mapPath).then((s) => s.blocks * 512, () => 0));
      await rm(l.mapPath, { force: true });
      await rm(l.dataPath, { force: true });
      used -= freed;
      evicted.push(l.digest);
    }
    if (evicted.length) this.deps.logger?.info({ layers: evicted, usedBytes: used, limitBytes: this.deps.limitBytes }, 'lazy layers: evicted cached data');
    return evicted;
  }

  /** Garbage collection: every file of a layer the cluster forgot (and no mount holds). Returns the digests removed. */
  async collect(): Promise<string[]> {
    const removed: string[] = [];
    const names = await readdir(this.deps.cacheDir).catch(() => [] as string[]);
    const hexes = new Set(names.flatMap((n) => (/^[0-9a-f]{64}\./.test(n) ? [n.slice(0, 64)] : [])));
    for (const hex of hexes) {
      const digest = `sha256:${hex}`;
      if (this.layers.get(digest)?.attached || this.loading.has(digest)) continue;
      if (!this.deps.layerKnown || (await this.deps.layerKnown(digest))) continue;
      const paths = this.pathsOf(hex);
      for (const p of [paths.tablePath, paths.mapPath, paths.dataPath, paths.metaPath]) await rm(p, { force: true });
      this.layers.delete(digest);
      removed.push(digest);
    }
    if (removed.length) this.deps.logger?.info({ layers: removed }, 'lazy layers: removed the cache files of deleted layers');
    return removed;
  }

  /** Chunks of a layer the cache holds (tests, figures). */
  presentChunks(digest: string): number {
    const l = this.layers.get(digest);
    return l ? this.presence(l).filter((b) => b === 1).length : 0;
  }

  /**
   * Stops fetching and closes the connection; the gate stays for a restarted worker. With
   * `shutdownGate` (nothing is mounted any more) the gate and its keeper end too.
   */
  async stop(options: { shutdownGate: boolean }): Promise<void> {
    this.stopped = true;
    clearTimeout(this.recordTimer);
    await this.flushRecords();
    if (options.shutdownGate && this.gate.connected && !(await this.gate.shutdown())) {
      this.deps.logger?.warn({}, 'lazy layers: the gate still holds blobs; left running');
    }
    this.gate.close();
  }
}

function runsOf(sorted: readonly number[], maxRun: number): { first: number; count: number }[] {
  const runs: { first: number; count: number }[] = [];
  for (const i of sorted) {
    const last = runs.at(-1);
    if (last && last.first + last.count === i && last.count < maxRun) last.count++;
    else runs.push({ first: i, count: 1 });
  }
  return runs;
}

async function writeAtomically(to: string, bytes: Buffer): Promise<void> {
  const tmp = `${to}.tmp-${randomBytes(4).toString('hex')}`;
  await writeFile(tmp, bytes, { mode: 0o600 });
  await rename(tmp, to);
}

function readQuiet(p: string): Buffer | undefined {
  try {
    return readFileSync(p);
  } catch {
    return undefined;
  }
}
