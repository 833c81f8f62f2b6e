import { isHere, presenceOf } from './cache-files.ts';
import { FillQueue, fetchChunks, type FillJob, type OriginOptions } from './fetcher.ts';
import type { GateClient } from './gate.ts';
import { runsOf } from './prefetch-recorder.ts';
import type { CachedLayer, LazyLayersLogger } from './types.ts';

/** Fetched chunk runs are at most this long (one range request). */
const MAX_RUN_BYTES = 16 * 1024 * 1024;
/**
 * A prefetch is one range request of at most this, one at a time (beside the reads' requests,
 * which go first in the queue): a list holds what most first runs read, which this host's
 * reads are about to ask for too, and chunks arrive as the body streams in.
 */
const PREFETCH_RUN_BYTES = 8 * 1024 * 1024;
const PREFETCH_CONCURRENCY = 1;
const EIO = 5;

export interface ChunkFillerDeps {
  gate: GateClient;
  /** A layer known here (by its 64 hex digits). */
  layerOf: (hex: string) => CachedLayer | undefined;
  origin: () => OriginOptions;
  /** Range requests at once. */
  concurrency: number;
  /** At most this many chunks fetched past a read that continues the one before (see demand). */
  readaheadChunks: number;
  logger?: LazyLayersLogger;
}

/** Per layer: where the last read's chunks ended, and how far ahead of it was fetched. */
interface Sequence {
  nextChunk: number;
  aheadEnd: number;
  streak: number;
}

/**
 * The gate's side of a read: chunks it asks for are fetched (merged with neighbouring asks),
 * checked, and handed back to it; a failed fetch answers the waiting reads with EIO.
 * Prefetch runs queue behind reads.
 */
export class ChunkFiller {
  private readonly fills: FillQueue;
  private readonly sequences = new Map<string, Sequence>();

  constructor(private readonly deps: ChunkFillerDeps) {
    this.fills = new FillQueue({ concurrency: deps.concurrency, prefetchConcurrency: PREFETCH_CONCURRENCY, maxRunBytes: MAX_RUN_BYTES, maxPrefetchRunBytes: PREFETCH_RUN_BYTES, chunkBytesOf: (hex) => deps.layerOf(hex)?.table.chunkSizeBytes ?? 1 << 20, run: (job) => this.fill(job) });
  }

  /**
   * A read waits on these chunks. A read that continues the last one of its layer (it starts
   * where that one ended, or in the chunks fetched ahead of it) is sequential: then 1, 2, up to
   * `readaheadChunks` chunks past it come in the same request, so the next read finds them
   * arriving instead of paying a round trip per chunk. A fixed 4 MiB ahead fetched twice the
   * bytes in the chunk-size sweep; growing it only along a run wastes at most a run's window
   * (still, bench:lazy 2026-12-03: 0.31 of the images fetched against 0.24, no sooner done: off
   * by default, ROLLBOX_LAZY_READAHEAD_CHUNKS).
   * Returns the chunks asked of the origin for it (with those fetched ahead: a read that goes
   * on into them raises no ask, so what a first run records is what it fetched).
   */
  demand(hex: string, first: number, count: number): { first: number; count: number } {
    const end = first + count;
    const seq = this.sequences.get(hex);
    const sequential = !!seq && first >= seq.nextChunk && first <= seq.aheadEnd;
    const streak = sequential ? seq.streak + 1 : 0;
    let ahead = streak === 0 ? 0 : Math.min(this.deps.readaheadChunks, 2 ** (streak - 1));
    const layer = this.deps.layerOf(hex);
    if (layer && ahead > 0) {
      const map = presenceOf(layer);
      let k = 0;
      while (k < ahead && end + k < layer.table.chunks.length && !isHere(layer, map, end + k)) k++;
      ahead = k;
    }
    this.sequences.set(hex, { nextChunk: end, aheadEnd: end + ahead, streak });
    this.fills.push({ hex, first, count: count + ahead, demand: true });
    return { first, count: count + ahead };
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
    // Each chunk goes to the gate as soon as it arrived and was checked (the socket keeps
    // their order): a read waiting on the first chunk of a long run does not wait for the rest.
    const written: Promise<unknown>[] = [];
    const deliver = (i: number, bytes: Buffer): void => {
      written.push(
        gate.data(job.hex, i, bytes).then(
          () => layer.delivered.add(i),
          (err: unknown) => logger?.warn({ digest: layer.digest, chunk: i, err: String(err) }, 'lazy layers: the gate did not write a chunk'),
        ),
      );
    };
    try {
      await fetchChunks(layer.digest, layer.table, first, end - first, this.deps.origin(), deliver);
    } catch (err) {
      logger?.warn({ digest: layer.digest, first: job.first, count: job.count, err: String(err) }, 'lazy layers: fetching chunks failed; their reads get EIO');
      // Chunks delivered before the failure stay (checked); the reads of the rest get EIO.
      gate.fail(job.hex, job.first, job.count, EIO);
      return;
    } finally {
      // Fetching until the gate has them: an ask for one meanwhile is not fetched again.
      await Promise.all(written);
      for (let i = first; i < end; i++) layer.fetching.delete(i);
    }
  }
}
