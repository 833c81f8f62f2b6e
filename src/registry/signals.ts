import type { ChainableCommander, Redis } from 'ioredis';
import { LuaScript } from '../redis/index.ts';
import { keys } from './keys.ts';

const RAISE_MAX = new LuaScript(import.meta.dirname, 'raise-signal-max');

/** Width of one signals bucket: the finest time step the console and capacity figures see. */
export const SIGNAL_BUCKET_SECONDS = 10;
/** How long a bucket is kept: bounds the signals' memory to about 1,080 small hashes. */
export const SIGNAL_RETENTION_SECONDS = 3 * 3600;
/**
 * Histograms are sparse log bins, 10 per decade from 1 ms: bin i holds values in
 * (10^((i-1)/10), 10^(i/10)] ms, so a quantile read from them is within 26% (one bin) of
 * the true value, for a create wait of 50 ms as for a residence of 5 hours. Only bins
 * that saw a value exist as hash fields.
 */
export const BINS_PER_DECADE = 10;
export const MAX_BIN = 90;

/** The histograms kept in each bucket: create wait (request to running), exec time, residence, residence of sandboxes from a warm pool. */
export const SIGNAL_HISTOGRAMS = ['wait', 'exec', 'res', 'poolres'] as const;
export type SignalHistogram = (typeof SIGNAL_HISTOGRAMS)[number];

export function binOf(ms: number): number {
  if (!(ms > 1)) return 0;
  return Math.min(MAX_BIN, Math.ceil(Math.log10(ms) * BINS_PER_DECADE - 1e-9));
}
export const binUpperMs = (bin: number): number => 10 ** (bin / BINS_PER_DECADE);

export const bucketStartSecOf = (atMs: number): number => Math.floor(atMs / 1000 / SIGNAL_BUCKET_SECONDS) * SIGNAL_BUCKET_SECONDS;

/** The counter fields one observation of `histogram` adds to its bucket. */
export function observationFields(histogram: SignalHistogram, ms: number): [string, number][] {
  const rounded = Math.max(0, Math.round(ms));
  return [[`${histogram}:n`, 1], [`${histogram}:sum`, rounded], [`${histogram}:b${binOf(rounded)}`, 1]];
}

export interface SignalBucket {
  startMs: number;
  fields: Record<string, number>;
}

/**
 * The signals in Redis: counters added per bucket (HINCRBY, then the bucket's expiry), a
 * few maxima, and reads of a time range. Writers batch what they saw (see the gateway's
 * SignalRecorder), so a busy gateway writes once a second and an idle one not at all.
 */
export class SignalStore {
  constructor(private readonly redis: Redis) {}

  /** Adds counters to the bucket of `atMs` inside a caller's pipeline (or MULTI). */
  static addTo(pipeline: ChainableCommander, atMs: number, fields: Iterable<[string, number]>): void {
    const key = keys.signalBucket(bucketStartSecOf(atMs));
    for (const [field, by] of fields) pipeline.hincrby(key, field, by);
    pipeline.expire(key, SIGNAL_RETENTION_SECONDS);
  }

  /** Adds counters, by bucket start (epoch seconds). */
  async add(byBucketSec: ReadonlyMap<number, ReadonlyMap<string, number>>): Promise<void> {
    if (byBucketSec.size === 0) return;
    const pipeline = this.redis.pipeline();
    for (const [bucketSec, fields] of byBucketSec) SignalStore.addTo(pipeline, bucketSec * 1000, fields);
    await pipeline.exec();
  }

  /** Raises a maximum kept in the bucket of `atMs` (true: it rose). */
  async raiseMax(atMs: number, field: string, value: number): Promise<boolean> {
    return (await RAISE_MAX.run(this.redis, [keys.signalBucket(bucketStartSecOf(atMs))], [field, String(value), String(SIGNAL_RETENTION_SECONDS)])) === 1;
  }

  /** Every bucket that starts in [fromMs, toMs), oldest first; buckets nobody wrote are absent. */
  async read(fromMs: number, toMs: number): Promise<SignalBucket[]> {
    const starts: number[] = [];
    for (let sec = bucketStartSecOf(fromMs); sec * 1000 < toMs; sec += SIGNAL_BUCKET_SECONDS) starts.push(sec);
    if (starts.length === 0) return [];
    const pipeline = this.redis.pipeline();
    for (const sec of starts) pipeline.hgetall(keys.signalBucket(sec));
    const answers = (await pipeline.exec()) ?? [];
    const buckets: SignalBucket[] = [];
    answers.forEach(([err, hash], i) => {
      if (err) throw err;
      const entries = Object.entries(hash as Record<string, string>);
      if (entries.length === 0) return;
      buckets.push({ startMs: starts[i]! * 1000, fields: Object.fromEntries(entries.map(([k, v]) => [k, Number(v)])) });
    });
    return buckets;
  }
}
