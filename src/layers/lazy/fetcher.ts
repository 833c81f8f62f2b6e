import { createHash } from 'node:crypto';
import { RollboxError, type LayerChunkTable } from '../../api/index.ts';
import { chunkRange } from '../split.ts';
import { decodedBody, getLayerFile } from '../sync.ts';

export interface OriginOptions {
  /** Gateway base URL: chunks come from `GET /v1/layers/:digest/blob` with `Range`. */
  gatewayUrl: string;
  /** Bearer token with layer read scope. */
  token: string;
  fetchImpl?: typeof fetch;
  /** One range request's deadline. */
  timeoutMs: number;
  /** How long an origin answering 503 (its cap on layer reads) is asked again (see getLayerFile; default 120 s). */
  busyRetryMs?: number;
  /** Told the bytes of each body read (what this host fetched from the origin). */
  onBytes?: (bytes: number) => void;
}

/**
 * Chunks [first, first + count) of a layer's blob in one HTTP range request, each checked
 * against the layer's chunk table: a chunk that does not hash to its digest (a corrupted
 * origin, a proxy that changed bytes) is `invalid_layer`. Without `onChunk`, nothing of a
 * request that fails is used; with it, each chunk is handed over as soon as its bytes arrived
 * and checked (a read waiting on the first chunk of a long run does not wait for the rest),
 * and a failure later in the body leaves the chunks handed over before it valid.
 */
export async function fetchChunks(digest: string, table: LayerChunkTable, first: number, count: number, origin: OriginOptions, onChunk?: (index: number, bytes: Buffer) => void): Promise<Buffer[]> {
  const start = chunkRange(table, first).start;
  const end = chunkRange(table, first + count - 1).end;
  const response = (await getLayerFile(digest, 'blob', { ...origin, attemptTimeoutMs: origin.timeoutMs }, { range: `bytes=${start}-${end - 1}` }))!;
  // A 200 is the whole blob (an origin that ignored the range): only usable when that is what was asked.
  const whole = response.status === 200 && start === 0 && end === table.blob.sizeBytes;
  if (response.status !== 206 && !whole) {
    await response.body?.cancel().catch(() => undefined);
    throw new RollboxError('unavailable', `layer ${digest}: asked bytes ${start}-${end - 1}, got ${response.status}`);
  }
  const chunks: Buffer[] = [];
  const body = Buffer.allocUnsafe(end - start);
  let received = 0;
  let next = first;
  const takeReady = (): void => {
    for (; next < first + count; next++) {
      const r = chunkRange(table, next);
      if (r.end - start > received) return;
      const bytes = body.subarray(r.start - start, r.end - start);
      const got = createHash('sha256').update(bytes).digest('hex');
      if (got !== table.chunks[next]) throw new RollboxError('invalid_layer', `layer ${digest}: chunk ${next} from the origin hashes to ${got}, its chunk table says ${table.chunks[next]}`);
      chunks.push(bytes);
      onChunk?.(next, bytes);
    }
  };
  try {
    for await (const piece of decodedBody(response)) {
      if (received + piece.length > body.length) throw new RollboxError('unavailable', `layer ${digest}: asked bytes ${start}-${end - 1}, got more`);
      body.set(piece, received);
      received += piece.length;
      origin.onBytes?.(piece.length);
      takeReady();
    }
  } catch (err) {
    await response.body?.cancel().catch(() => undefined);
    if (err instanceof RollboxError) throw err;
    throw new RollboxError('unavailable', `layer ${digest}: reading chunks ${first}..${first + count - 1} failed: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (received !== body.length) throw new RollboxError('unavailable', `layer ${digest}: asked bytes ${start}-${end - 1}, got ${response.status} with ${received} bytes`);
  return chunks;
}

/** Work for the fill queue: chunks of one layer, asked by a waiting read or by a prefetch. */
export interface FillJob {
  hex: string;
  first: number;
  count: number;
  /** A read waits on it (first), or a prefetch list fills ahead (when nothing waits). */
  demand: boolean;
}

/**
 * Fetches queued chunk runs, demand before prefetch, at most `concurrency` at once (of
 * which at most `prefetchConcurrency` prefetches): a run taken is merged with the queued
 * runs of the same layer it touches or adjoins, up to `maxRunBytes` (prefetch alone: up to
 * `maxPrefetchRunBytes`), so reads of neighbouring chunks become one request.
 */
export class FillQueue {
  private readonly queue: FillJob[] = [];
  private active = 0;
  private activePrefetch = 0;
  private idleWaiters: (() => void)[] = [];

  constructor(
    private readonly opts: {
      concurrency: number;
      prefetchConcurrency: number;
      /** Longest run one request fetches (a merged run with a read in it). */
      maxRunBytes: number;
      /** Longest run of prefetch only. */
      maxPrefetchRunBytes: number;
      chunkBytesOf: (hex: string) => number;
      run: (job: FillJob) => Promise<void>;
    },
  ) {}

  push(job: FillJob): void {
    this.queue.push(job);
    this.pump();
  }

  get size(): number {
    return this.queue.length + this.active;
  }

  /** Resolves when nothing is queued or running. */
  idle(): Promise<void> {
    if (this.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  private pump(): void {
    while (this.active < this.opts.concurrency) {
      let i = this.queue.findIndex((j) => j.demand);
      // Reads' runs first; at most `prefetchConcurrency` prefetches beside them (a prefetch list
      // holds what the reads here are about to ask for: starved while reads ran, it came too late).
      if (i < 0 && this.activePrefetch < this.opts.prefetchConcurrency) i = 0;
      const job = i >= 0 ? this.queue.splice(i, 1)[0] : undefined;
      if (!job) break;
      const merged = this.merge(job);
      this.active++;
      if (!merged.demand) this.activePrefetch++;
      void this.opts
        .run(merged)
        .catch(() => undefined)
        .finally(() => {
          this.active--;
          if (!merged.demand) this.activePrefetch--;
          this.pump();
          if (this.size === 0) for (const w of this.idleWaiters.splice(0)) w();
        });
    }
  }

  private merge(job: FillJob): FillJob {
    let { first, count, demand } = job;
    for (let changed = true; changed; ) {
      changed = false;
      for (let k = 0; k < this.queue.length; k++) {
        const other = this.queue[k]!;
        if (other.hex !== job.hex) continue;
        const lo = Math.min(first, other.first);
        const hi = Math.max(first + count, other.first + other.count);
        const maxBytes = demand || other.demand ? this.opts.maxRunBytes : this.opts.maxPrefetchRunBytes;
        if (other.first > first + count || first > other.first + other.count || (hi - lo) * this.opts.chunkBytesOf(job.hex) > maxBytes) continue;
        first = lo;
        count = hi - lo;
        demand ||= other.demand;
        this.queue.splice(k, 1);
        changed = true;
        break;
      }
    }
    return { hex: job.hex, first, count, demand };
  }
}
