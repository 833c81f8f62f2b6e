import type { LayerChunkTable } from '../../api/index.ts';
import type { OriginOptions } from './fetcher.ts';

/** Chunk lists of layers, recorded from the first runs that read them (see PrefetchLists in src/registry). */
export interface PrefetchStore {
  /** The chunks most of the layer's recorded first runs read, ascending. */
  chunks(digest: string): Promise<number[]>;
  /** A first run of the layer starts on this host: true if its reads are to be recorded. */
  openRun(digest: string): Promise<boolean>;
  /** Chunks an open run read, each once per run. */
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
  /** How long a host's first run of a layer records its reads, from its mount. */
  prefetchWindowMs?: number;
  /** Chunks fetched past a read that continues the one before (0: only what reads ask). */
  readaheadChunks?: number;
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

/** A layer's files in the host's chunk cache. */
export interface LayerPaths {
  tablePath: string;
  metaPath: string;
  dataPath: string;
  mapPath: string;
}

export interface CachedLayer extends LayerPaths {
  digest: string;
  hex: string;
  table: LayerChunkTable;
  attached: boolean;
  lastUsedMs: number;
  /** A mounted layer the gate no longer guards (see onUnsafe): not handed out until unmounted. */
  unsafe?: boolean;
  /** Chunks a request is fetching now. */
  fetching: Set<number>;
  /** Chunks handed to the gate while attached (its map says so only once they are synced, a moment later). */
  delivered: Set<number>;
}
