import type { Redis } from 'ioredis';
import { keys } from './keys.ts';

/** Chunks recorded per layer at most (a list past it says little more than "all of it"). */
const MAX_CHUNKS = 65_536;

/**
 * Prefetch lists of lazy layers: the chunks a layer's first runs read, recorded by the hosts
 * that fetched them during `windowMs` from the first record on (ROLLBOX_LAZY_PREFETCH_WINDOW_MS),
 * and filled ahead by the hosts that mount it later. An image's list is its layers'.
 */
export class PrefetchLists {
  constructor(
    private readonly redis: Redis,
    private readonly windowMs = 120_000,
  ) {}

  async chunks(digest: string): Promise<number[]> {
    return (await this.redis.smembers(keys.layerPrefetch(digest))).map(Number);
  }

  async record(digest: string, chunks: readonly number[]): Promise<void> {
    if (chunks.length === 0) return;
    const replies = (await this.redis.multi().exists(keys.layerPrefetchOpen(digest)).scard(keys.layerPrefetch(digest)).exec()) ?? [];
    const open = Number(replies[0]?.[1] ?? 0);
    const size = Number(replies[1]?.[1] ?? 0);
    // Closed: the first runs are over (the list exists and its window has passed).
    if (!open && size > 0) return;
    if (size >= MAX_CHUNKS) return;
    const multi = this.redis.multi();
    if (!open) multi.set(keys.layerPrefetchOpen(digest), '1', 'PX', this.windowMs, 'NX');
    multi.sadd(keys.layerPrefetch(digest), ...chunks.map(String));
    await multi.exec();
  }

  /** With the layer (garbage collection). */
  async forget(digest: string): Promise<void> {
    await this.redis.del(keys.layerPrefetch(digest), keys.layerPrefetchOpen(digest));
  }
}
