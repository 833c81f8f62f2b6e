import type { Redis } from 'ioredis';
import { ForkResult } from '../api/index.ts';
import { keys } from './keys.ts';

/** Fork Idempotency-Keys are remembered this long (as create's are). */
const FORK_IDEMPOTENCY_TTL_SEC = 24 * 3600;

export type ForkClaim = { kind: 'new' } | { kind: 'exists'; requestHash: string; result?: ForkResult };

/**
 * A fork's Idempotency-Key. The first request claims it with its body's hash; its answer
 * (the children, in order) is written once every child has settled, so a re-sent request
 * reads the same children instead of packing the parent again and making N more.
 */
export class ForkRecords {
  constructor(private readonly redis: Redis) {}

  async claim(tenant: string, idempotencyKey: string, requestHash: string): Promise<ForkClaim> {
    const key = keys.forkIdempotency(tenant, idempotencyKey);
    if (await this.redis.set(key, JSON.stringify({ requestHash }), 'EX', FORK_IDEMPOTENCY_TTL_SEC, 'NX')) return { kind: 'new' };
    const stored = await this.read(tenant, idempotencyKey);
    // Released between the two calls (the first request failed before any child): ours now.
    return stored ? { kind: 'exists', ...stored } : this.claim(tenant, idempotencyKey, requestHash);
  }

  /** What a key holds: the request's hash, and its answer once the fork has finished. */
  async read(tenant: string, idempotencyKey: string): Promise<{ requestHash: string; result?: ForkResult } | undefined> {
    const stored = await this.redis.get(keys.forkIdempotency(tenant, idempotencyKey));
    if (!stored) return undefined;
    const parsed = JSON.parse(stored) as { requestHash: string; result?: unknown };
    return { requestHash: parsed.requestHash, ...(parsed.result ? { result: ForkResult.parse(parsed.result) } : {}) };
  }

  async complete(tenant: string, idempotencyKey: string, requestHash: string, result: ForkResult): Promise<void> {
    await this.redis.set(keys.forkIdempotency(tenant, idempotencyKey), JSON.stringify({ requestHash, result }), 'EX', FORK_IDEMPOTENCY_TTL_SEC);
  }

  /** Frees a key whose fork made nothing (the parent could not be packed, every child refused): a retry tries again. */
  async release(tenant: string, idempotencyKey: string): Promise<void> {
    await this.redis.del(keys.forkIdempotency(tenant, idempotencyKey));
  }
}
