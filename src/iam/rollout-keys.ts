import { createHash, randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { ROLLOUT_KEY_PATTERN, RollboxError, type Scope } from '../api/index.ts';
import { isValidTenant, type Principal, type RolloutGrant } from './principal.ts';

/**
 * What a hosted rollout's key may do: run commands and move files in the rollout's own
 * sandboxes, read them, and call the model gateway as this rollout. Nothing else (the
 * gateway's confinement middleware refuses every other route for such a principal).
 */
export const ROLLOUT_KEY_SCOPES: readonly Scope[] = ['sandbox:exec', 'sandbox:read', 'model:call'];

/** What is kept of a key: never the key itself, only its sha256. */
interface RolloutKeyRecord {
  rolloutId: string;
  tenant: string;
  job: string;
  createdAt: string;
}

/** `{rollout-keys}`: a record and its index in one MULTI, so they share a cluster slot. */
const recordKey = (sha: string) => `rb:{rollout-keys}:key:${sha}`;
const indexKey = (rolloutId: string) => `rb:{rollout-keys}:rollout:${rolloutId}`;
const sandboxesKey = (rolloutId: string) => `rb:{rollout-keys}:sandboxes:${rolloutId}`;
/** A revoked key is refused by every gateway within this long (each caches what it verified). */
export const ROLLOUT_KEY_CACHE_MS = 2000;

const sha256 = (value: string) => createHash('sha256').update(value).digest('hex');

/**
 * Keys of hosted rollouts (`rbr_<40 hex>`): one per rollout, handed to its agent sandbox as
 * `ROLLBOX_TOKEN`, `OPENAI_API_KEY` and `ANTHROPIC_API_KEY`, so the one secret the agent
 * holds reaches its own task sandboxes and the model gateway as this rollout, and nothing
 * else. Opaque and kept in Redis (not a JWT) so that ending the rollout revokes it on every
 * gateway within `ROLLOUT_KEY_CACHE_MS`, and so that its sandboxes can be added as the
 * rollout creates them.
 */
export class RolloutKeyStore {
  private readonly cache = new Map<string, { principal: Principal | undefined; atMs: number }>();

  constructor(
    private readonly redis: Redis,
    private readonly now: () => number = Date.now,
  ) {}

  /** A new key for the rollout (an earlier one is revoked); it lapses after `ttlSeconds` whatever happens. */
  async issue(input: { tenant: string; rolloutId: string; job: string; ttlSeconds: number }): Promise<string> {
    if (!isValidTenant(input.tenant)) throw new RollboxError('invalid_request', `tenant ${input.tenant} is not [A-Za-z0-9_.-]{1,64}`);
    if (!Number.isSafeInteger(input.ttlSeconds) || input.ttlSeconds <= 0) throw new RollboxError('invalid_request', 'ttlSeconds must be a positive integer');
    await this.revoke(input.rolloutId);
    const key = `rbr_${randomBytes(20).toString('hex')}`;
    const record: RolloutKeyRecord = { rolloutId: input.rolloutId, tenant: input.tenant, job: input.job, createdAt: new Date(this.now()).toISOString() };
    const sha = sha256(key);
    await this.redis
      .multi()
      .set(recordKey(sha), JSON.stringify(record), 'EX', input.ttlSeconds)
      .set(indexKey(input.rolloutId), sha, 'EX', input.ttlSeconds)
      .expire(sandboxesKey(input.rolloutId), input.ttlSeconds)
      .exec();
    return key;
  }

  /** Ends the rollout's key (and its sandbox grants) at once on this gateway, within the cache time on others. */
  async revoke(rolloutId: string): Promise<void> {
    const sha = await this.redis.get(indexKey(rolloutId));
    const multi = this.redis.multi().del(indexKey(rolloutId), sandboxesKey(rolloutId));
    if (sha) multi.del(recordKey(sha));
    await multi.exec();
    for (const [key, hit] of this.cache) if (hit.principal?.rollout?.id === rolloutId) this.cache.delete(key);
  }

  /** Lets the rollout's key reach this sandbox (a task sandbox the rollout created). */
  async grantSandbox(rolloutId: string, sandboxId: string, ttlSeconds: number): Promise<void> {
    await this.redis.multi().sadd(sandboxesKey(rolloutId), sandboxId).expire(sandboxesKey(rolloutId), ttlSeconds).exec();
  }

  /** Whether the rollout's key may reach this sandbox (asked of Redis each time: grants change as the rollout runs). */
  async allowsSandbox(grant: RolloutGrant, sandboxId: string): Promise<boolean> {
    return (await this.redis.sismember(sandboxesKey(grant.id), sandboxId)) === 1;
  }

  /** The principal of a key, or `unauthenticated` for a missing, malformed, unknown, lapsed or revoked one. */
  async verify(key: string | undefined): Promise<Principal> {
    if (!key || !ROLLOUT_KEY_PATTERN.test(key)) throw new RollboxError('unauthenticated', 'invalid rollout key (expected rbr_<40 hex digits>)');
    const nowMs = this.now();
    let hit = this.cache.get(key);
    if (!hit || nowMs - hit.atMs > ROLLOUT_KEY_CACHE_MS) {
      const row = await this.redis.get(recordKey(sha256(key)));
      const record = row ? (JSON.parse(row) as RolloutKeyRecord) : undefined;
      const principal: Principal | undefined = record && Object.freeze({ tenant: record.tenant, scopes: new Set(ROLLOUT_KEY_SCOPES), subject: `rollout:${record.rolloutId}`, rollout: Object.freeze({ id: record.rolloutId, job: record.job }) });
      hit = { principal, atMs: nowMs };
      if (this.cache.size > 10_000) this.cache.clear();
      this.cache.set(key, hit);
    }
    if (!hit.principal) throw new RollboxError('unauthenticated', 'rollout key unknown, lapsed or revoked (the rollout ended)');
    return hit.principal;
  }
}
