import type { Redis } from 'ioredis';
import { keys } from './keys.ts';

/** Chunks counted per layer at most (a list past it says little more than "all of it"). */
const MAX_CHUNKS = 65_536;

/**
 * Prefetch lists of lazy layers, from the first runs that read them: a run is one host's
 * first `ROLLBOX_LAZY_PREFETCH_WINDOW_MS` with a layer it held nothing of. The first
 * `maxRuns` runs each count the chunks they read once; a layer's list is the chunks more than
 * half of its recorded runs read (its "imports", which every task of it reads), not the union
 * of what they read (which holds every early task's own reads: fetched ahead on every later
 * host, they only compete for the link with the reads that need it).
 */
export class PrefetchLists {
  constructor(
    private readonly redis: Redis,
    private readonly maxRuns = 8,
  ) {}

  async chunks(digest: string): Promise<number[]> {
    const [runsReply, countsReply] = (await this.redis.multi().get(keys.layerPrefetchRuns(digest)).hgetall(keys.layerPrefetchCounts(digest)).exec()) ?? [];
    const runs = Math.min(this.maxRuns, Number(runsReply?.[1] ?? 0));
    const counts = (countsReply?.[1] ?? {}) as Record<string, string>;
    return Object.entries(counts)
      .filter(([, n]) => Number(n) > runs / 2)
      .map(([chunk]) => Number(chunk))
      .sort((a, b) => a - b);
  }

  /** A first run of the layer starts: true if it is one of the first `maxRuns` (then its reads count). */
  async openRun(digest: string): Promise<boolean> {
    return (await this.redis.incr(keys.layerPrefetchRuns(digest))) <= this.maxRuns;
  }

  /** Chunks an open run read (each once per run: the caller sends each chunk once). */
  async record(digest: string, chunks: readonly number[]): Promise<void> {
    if (chunks.length === 0) return;
    const key = keys.layerPrefetchCounts(digest);
    if ((await this.redis.hlen(key)) >= MAX_CHUNKS) return;
    const multi = this.redis.multi();
    for (const c of chunks) multi.hincrby(key, String(c), 1);
    await multi.exec();
  }

  /** With the layer (garbage collection). */
  async forget(digest: string): Promise<void> {
    await this.redis.del(keys.layerPrefetchRuns(digest), keys.layerPrefetchCounts(digest));
    await Promise.all(keys.layerPrefetchLegacy(digest).map((key) => this.redis.del(key)));
  }
}
