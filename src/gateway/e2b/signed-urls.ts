import { createHash, timingSafeEqual } from 'node:crypto';
import type { Redis } from 'ioredis';
import { keys } from '../../registry/index.ts';
import type { EnvdAccess } from './access.ts';
import { ConnectError } from './connect.ts';

/** What a signed `/files` URL carries (the SDK's downloadUrl / uploadUrl). */
export interface SignedFileRequest {
  path: string;
  operation: 'read' | 'write';
  /** The `username` parameter; '' when absent (the sandbox's own user). */
  username: string;
  signature: string;
  /** `signature_expiration`, unix seconds; absent: the URL does not expire. */
  expiration: number | undefined;
}

/** Sandboxes whose token this gateway keeps (ids are never reused, a tenant never changes). */
const MAX_TOKENS_CACHED = 100_000;
/** Candidates checked between two turns of the event loop. */
const YIELD_EVERY = 256;

/** envd's signature: `v1_` + base64 (unpadded) sha256 of `path:operation:username:token[:expiration]`. */
export function signatureOf(req: Omit<SignedFileRequest, 'signature'>, token: string): string {
  const raw = [req.path, req.operation, req.username, token, ...(req.expiration === undefined ? [] : [String(req.expiration)])].join(':');
  return `v1_${createHash('sha256').update(raw).digest('base64').replace(/=+$/, '')}`;
}

const sameString = (a: string, b: string) => a.length === b.length && timingSafeEqual(Buffer.from(a), Buffer.from(b));

/**
 * Signed file URLs, checked as envd checks them: the signature over the path, the
 * operation, the user and the sandbox's access token (and its expiration, which must not
 * have passed). A URL the SDK builds for the single origin names no sandbox: when neither
 * the `E2b-Sandbox-Id` header nor a `49983-<id>.<domain>` host does, the sandbox is the one
 * placed sandbox of the cluster whose token makes the signature (one sha256 each, tokens
 * kept per gateway; a forged or tampered URL matches none).
 */
export class SignedUrls {
  private readonly tokens = new Map<string, { tenant: string; token: string }>();

  constructor(
    private readonly redis: Redis,
    private readonly access: Pick<EnvdAccess, 'tokenFor'>,
    private readonly now: () => number = Date.now,
  ) {}

  /** The sandbox the URL is signed for, and its tenant; `unauthenticated` if it is none (or expired). */
  async verify(req: SignedFileRequest, sandboxId: string | undefined): Promise<{ sandboxId: string; tenant: string }> {
    const candidates = sandboxId ? [sandboxId] : await this.liveSandboxes();
    const tokens = await this.tokensOf(candidates);
    let found: string | undefined;
    for (let i = 0; i < candidates.length && !found; i++) {
      const token = tokens.get(candidates[i]!);
      if (token && sameString(signatureOf(req, token.token), req.signature)) found = candidates[i];
      // A long search lets other requests run between its slices.
      if (i % YIELD_EVERY === YIELD_EVERY - 1) await new Promise((r) => setImmediate(r));
    }
    if (!found) throw new ConnectError('unauthenticated', sandboxId ? `invalid signature for sandbox ${sandboxId}` : 'invalid signature: it is not the signature of any running sandbox');
    if (req.expiration !== undefined && req.expiration < Math.floor(this.now() / 1000)) throw new ConnectError('unauthenticated', 'signature is already expired');
    return { sandboxId: found, tenant: tokens.get(found)!.tenant };
  }

  /** Every sandbox placed on a node of the cluster (the node sets: one call per node). */
  private async liveSandboxes(): Promise<string[]> {
    const nodes = await this.redis.hkeys(keys.nodes);
    return [...new Set((await Promise.all(nodes.map((n) => this.redis.smembers(keys.nodeSandboxes(n))))).flat())];
  }

  /** Each sandbox's tenant and access token (neither ever changes), read and computed once per gateway. */
  private async tokensOf(ids: readonly string[]): Promise<Map<string, { tenant: string; token: string }>> {
    const missing = ids.filter((id) => !this.tokens.has(id));
    // Separate reads (each record is its own cluster slot), sent together by auto-pipelining.
    const tenants = await Promise.all(missing.map((id) => this.redis.hget(keys.sandbox(id), 'tenant')));
    if (this.tokens.size + missing.length > MAX_TOKENS_CACHED) this.tokens.clear();
    for (const [i, id] of missing.entries()) if (tenants[i]) this.tokens.set(id, { tenant: tenants[i], token: await this.access.tokenFor(id, tenants[i]) });
    return this.tokens;
  }
}
