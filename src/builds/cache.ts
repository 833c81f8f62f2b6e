import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { LayerDigest } from '../api/index.ts';
import { keys, type LayerRegistry } from '../registry/index.ts';

export interface StepCacheDeps {
  redis: Redis;
  layers: Pick<LayerRegistry, 'get' | 'pin'>;
  /** A cached step's layer is kept (pinned against layer garbage collection) this long after its last use. */
  ttlMs: number;
  now: () => number;
}

const POLL_MS = 200;

/**
 * Build steps' layers by cache key, one tenant's apart from another's, shared by every
 * gateway. A step is run by whoever holds its key's lock; a build finding the lock held
 * waits for the holder's layer instead of running the step again.
 *
 * The lock is a plain `SET NX PX` renewed by its holder (a check of the token, then
 * PEXPIRE): between the two the lock would have to lapse and be taken by another, which
 * a renewal every third of the lease leaves no room for; at worst a step runs twice and
 * the second layer replaces the first in the cache, both correct.
 */
export class StepCache {
  constructor(private readonly deps: StepCacheDeps) {}

  /** The layer of a step run before whose layer is still registered (its pin renewed), else undefined. */
  async get(tenant: string, key: string): Promise<LayerDigest | undefined> {
    const digest = await this.deps.redis.get(keys.buildCache(tenant, key));
    if (!digest || !(await this.deps.layers.get(digest))) return undefined;
    await this.keep(tenant, key, digest);
    return digest;
  }

  async put(tenant: string, key: string, digest: LayerDigest): Promise<void> {
    await this.keep(tenant, key, digest);
  }

  private async keep(tenant: string, key: string, digest: LayerDigest): Promise<void> {
    await this.deps.layers.pin(digest, this.deps.now() + this.deps.ttlMs);
    await this.deps.redis.set(keys.buildCache(tenant, key), digest, 'PX', this.deps.ttlMs);
  }

  /**
   * The step's layer: from the cache, or made by `run` under the key's lock (then cached),
   * or, while another build holds the lock, the layer that build stores. `waitMs` bounds
   * the wait for another's; past it this build runs the step itself.
   */
  async getOrRun(tenant: string, key: string, leaseMs: number, waitMs: number, run: () => Promise<LayerDigest>): Promise<{ digest: LayerDigest; cached: boolean }> {
    const lockKey = keys.buildCacheLock(tenant, key);
    const deadline = this.deps.now() + waitMs;
    for (;;) {
      const cached = await this.get(tenant, key);
      if (cached) return { digest: cached, cached: true };
      const token = randomBytes(12).toString('hex');
      if ((await this.deps.redis.set(lockKey, token, 'PX', leaseMs, 'NX')) === 'OK' || this.deps.now() >= deadline) {
        const renew = setInterval(() => void this.renew(lockKey, token, leaseMs), Math.max(100, Math.floor(leaseMs / 3)));
        try {
          // Stored between our look and our lock by the build that held it: taken, not made again.
          const stored = await this.get(tenant, key);
          if (stored) return { digest: stored, cached: true };
          const digest = await run();
          await this.put(tenant, key, digest);
          return { digest, cached: false };
        } finally {
          clearInterval(renew);
          if ((await this.deps.redis.get(lockKey)) === token) await this.deps.redis.del(lockKey);
        }
      }
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  }

  private async renew(lockKey: string, token: string, leaseMs: number): Promise<void> {
    if ((await this.deps.redis.get(lockKey).catch(() => null)) === token) await this.deps.redis.pexpire(lockKey, leaseMs).catch(() => undefined);
  }
}
