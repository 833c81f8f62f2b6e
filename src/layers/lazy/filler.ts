import { isHere, presenceOf } from './cache-files.ts';
import { FillQueue, fetchChunks, type FillJob, type OriginOptions } from './fetcher.ts';
import type { GateClient } from './gate.ts';
import { runsOf } from './prefetch-recorder.ts';
import type { CachedLayer, LazyLayersLogger } from './types.ts';

/** Fetched chunk runs are at most this long (one range request). */
const MAX_RUN_BYTES = 16 * 1024 * 1024;
/**
 * A prefetch is one range request of at most this, one at a time: on a shared link, reads
 * that wait get their turn between them.
 */
const PREFETCH_RUN_BYTES = 4 * 1024 * 1024;
const PREFETCH_CONCURRENCY = 1;
const EIO = 5;

export interface ChunkFillerDeps {
  gate: GateClient;
  /** A layer known here (by its 64 hex digits). */
  layerOf: (hex: string) => CachedLayer | undefined;
  origin: () => OriginOptions;
  /** Range requests at once. */
  concurrency: number;
  logger?: LazyLayersLogger;
}

/**
 * The gate's side of a read: chunks it asks for are fetched (merged with neighbouring asks),
 * checked, and handed back to it; a failed fetch answers the waiting reads with EIO.
 * Prefetch runs queue behind reads.
 */
export class ChunkFiller {
  private readonly fills: FillQueue;

  constructor(private readonly deps: ChunkFillerDeps) {
    this.fills = new FillQueue({ concurrency: deps.concurrency, prefetchConcurrency: PREFETCH_CONCURRENCY, maxRunBytes: MAX_RUN_BYTES, maxPrefetchRunBytes: PREFETCH_RUN_BYTES, chunkBytesOf: (hex) => deps.layerOf(hex)?.table.chunkSizeBytes ?? 1 << 20, run: (job) => this.fill(job) });
  }

  /** A read waits on these chunks. */
  demand(hex: string, first: number, count: number): void {
    // Only what the read needs: fetching ahead (4 MiB past reads that continued a run) fetched
    // twice the bytes in the chunk-size sweep and made the reads slower, not faster.
    this.fills.push({ hex, first, count, demand: true });
  }

  /** The layer's chunks the cache lacks, of these, fetched in the background; resolves when the queue is idle. */
  async prefetch(layer: CachedLayer, chunks: readonly number[]): Promise<void> {
    const wanted = chunks.filter((i) => Number.isInteger(i) && i >= 0 && i < layer.table.chunks.length).sort((a, b) => a - b);
    const map = presenceOf(layer);
    const missing = wanted.filter((i) => !isHere(layer, map, i));
    for (const run of runsOf(missing, Math.max(1, Math.floor(PREFETCH_RUN_BYTES / layer.table.chunkSizeBytes)))) this.fills.push({ hex: layer.hex, first: run.first, count: run.count, demand: false });
    await this.fills.idle();
  }

  /** No layer of this id: the reads get EIO. */
  refuse(hex: string, first: number, count: number): void {
    this.deps.gate.fail(hex, first, count, EIO);
  }

  private async fill(job: FillJob): Promise<void> {
    const { gate, logger } = this.deps;
    const layer = this.deps.layerOf(job.hex);
    if (!layer || !layer.attached) {
      if (job.demand) gate.fail(job.hex, job.first, job.count, EIO);
      return;
    }
    // Chunks being fetched by another request are not fetched again, nor (a prefetch) those here already.
    // The gate asks only for what it lacks: a read's chunks are fetched even if delivered before (a new gate).
    const map = presenceOf(layer);
    const skip = (i: number) => layer.fetching.has(i) || (!job.demand && isHere(layer, map, i));
    let first = job.first;
    let end = job.first + job.count;
    while (first < end && skip(first)) first++;
    while (end > first && skip(end - 1)) end--;
    if (first === end) return;
    for (let i = first; i < end; i++) layer.fetching.add(i);
    let chunks: Buffer[];
    try {
      chunks = await fetchChunks(layer.digest, layer.table, first, end - first, this.deps.origin());
    } catch (err) {
      logger?.warn({ digest: layer.digest, first: job.first, count: job.count, err: String(err) }, 'lazy layers: fetching chunks failed; their reads get EIO');
      gate.fail(job.hex, job.first, job.count, EIO);
      return;
    } finally {
      for (let i = first; i < end; i++) layer.fetching.delete(i);
    }
    await Promise.all(
      chunks.map((bytes, i) =>
        gate.data(job.hex, first + i, bytes).then(
          () => layer.delivered.add(first + i),
          (err: unknown) => logger?.warn({ digest: layer.digest, chunk: first + i, err: String(err) }, 'lazy layers: the gate did not write a chunk'),
        ),
      ),
    );
  }
}
