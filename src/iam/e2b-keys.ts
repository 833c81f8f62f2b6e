import { createHash, randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { E2B_API_KEY_PATTERN, RollboxError, type Scope } from '../api/index.ts';
import { isScope, isValidTenant, type Principal } from './principal.ts';

/** What is kept of a key: never the key itself, only its sha256. */
export interface E2bKeyRecord {
  keyId: string;
  tenant: string;
  scopes: Scope[];
  name?: string;
  createdAt: string;
}

/** `{e2b-keys}`: a record and the index change in one MULTI, so they share a cluster slot. */
const recordKey = (sha: string) => `rb:{e2b-keys}:key:${sha}`;
const INDEX = 'rb:{e2b-keys}:index';
/** A revoked key is refused by every gateway within this long (each caches what it verified). */
export const E2B_KEY_CACHE_MS = 5000;

const sha256 = (value: string) => createHash('sha256').update(value).digest('hex');

/**
 * E2B API keys (`X-API-Key: e2b_<40 hex>`, the only shape the SDK sends) standing for a
 * rollbox tenant and scopes, kept in Redis so every gateway knows them; issued, listed and
 * revoked with `rollbox e2b-key`. A key is shown once, at issue.
 */
export class E2bKeyStore {
  private readonly cache = new Map<string, { principal: Principal | undefined; atMs: number }>();

  constructor(
    private readonly redis: Redis,
    private readonly now: () => number = Date.now,
  ) {}

  async issue(input: { tenant: string; scopes: readonly string[]; name?: string }): Promise<{ key: string; record: E2bKeyRecord }> {
    if (!isValidTenant(input.tenant)) throw new RollboxError('invalid_request', `tenant ${input.tenant} is not [A-Za-z0-9_.-]{1,64}`);
    const unknown = input.scopes.filter((s) => !isScope(s));
    if (unknown.length || input.scopes.length === 0) throw new RollboxError('invalid_request', `unknown or no scopes: ${unknown.join(',') || '(none)'}`);
    const key = `e2b_${randomBytes(20).toString('hex')}`;
    const record: E2bKeyRecord = { keyId: randomBytes(6).toString('hex'), tenant: input.tenant, scopes: input.scopes as Scope[], createdAt: new Date(this.now()).toISOString(), ...(input.name ? { name: input.name } : {}) };
    const sha = sha256(key);
    await this.redis.multi().set(recordKey(sha), JSON.stringify(record)).hset(INDEX, record.keyId, sha).exec();
    return { key, record };
  }

  async list(): Promise<E2bKeyRecord[]> {
    const shas = Object.values(await this.redis.hgetall(INDEX));
    if (shas.length === 0) return [];
    const rows = await this.redis.mget(...shas.map(recordKey));
    return rows.flatMap((row) => (row ? [JSON.parse(row) as E2bKeyRecord] : []));
  }

  /** False when no key has this id. */
  async revoke(keyId: string): Promise<boolean> {
    const sha = await this.redis.hget(INDEX, keyId);
    if (!sha) return false;
    await this.redis.multi().del(recordKey(sha)).hdel(INDEX, keyId).exec();
    return true;
  }

  /** The principal of a key, or `unauthenticated` (E2B's 401) for a missing, malformed, unknown or revoked one. */
  async verify(key: string | undefined): Promise<Principal> {
    if (!key || !E2B_API_KEY_PATTERN.test(key)) throw new RollboxError('unauthenticated', 'Invalid API key: send X-API-Key: e2b_<40 hex digits> (issue one with rollbox e2b-key issue)');
    const nowMs = this.now();
    let hit = this.cache.get(key);
    if (!hit || nowMs - hit.atMs > E2B_KEY_CACHE_MS) {
      const row = await this.redis.get(recordKey(sha256(key)));
      const record = row ? (JSON.parse(row) as E2bKeyRecord) : undefined;
      hit = { principal: record && { tenant: record.tenant, scopes: new Set(record.scopes), subject: `e2b-key:${record.keyId}`, tokenId: record.keyId }, atMs: nowMs };
      if (this.cache.size > 10_000) this.cache.clear();
      this.cache.set(key, hit);
    }
    if (!hit.principal) throw new RollboxError('unauthenticated', 'Invalid API key: unknown or revoked');
    return hit.principal;
  }
}
