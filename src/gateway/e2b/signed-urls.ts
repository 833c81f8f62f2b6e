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

/** Sandboxes whose tenant this gateway has read (ids are never reused, a tenant never changes). */
const MAX_TENANTS_CACHED = 100_000;

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
 * live sandbox of the cluster whose token makes the signature (each checked costs two
 * hashes; a forged or tampered URL matches none).
 */
export class SignedUrls {
  private readonly tenants = new Map<string, string>();

  constructor(
    private readonly redis: Redis,
    private readonly access: Pick<EnvdAccess, 'tokenFor'>,
    private readonly now: () => number = Date.now,
  ) {}

  /** The sandbox the URL is signed for, and its tenant; `unauthenticated` if it is none (or expired). */
  async verify(req: SignedFileRequest, sandboxId: string | undefined): Promise<{ sandboxId: string; tenant: string }> {
    const candidates = sandboxId ? [sandboxId] : await this.liveSandboxes();
    const tenants = await this.tenantsOf(candidates);
    let found: { sandboxId: string; tenant: string } | undefined;
    for (const id of candidates) {
      const tenant = tenants.get(id);
      if (tenant !== undefined && sameString(signatureOf(req, await this.access.tokenFor(id, tenant)), req.signature)) found = { sandboxId: id, tenant };
      if (found) break;
    }
    if (!found) throw new ConnectError('unauthenticated', sandboxId ? `invalid signature for sandbox ${sandboxId}` : 'invalid signature: it is not the signature of any running sandbox');
    if (req.expiration !== undefined && req.expiration < Math.floor(this.now() / 1000)) throw new ConnectError('unauthenticated', 'signature is already expired');
    return found;
  }

  /** Every sandbox placed on a node of the cluster (the node sets: one call per node). */
  private async liveSandboxes(): Promise<string[]> {
    const nodes = await this.redis.hkeys(keys.nodes);
    return [...new Set((await Promise.all(nodes.map((n) => this.redis.smembers(keys.nodeSandboxes(n))))).flat())];
  }

  private async tenantsOf(ids: readonly string[]): Promise<Map<string, string>> {
    const missing = ids.filter((id) => !this.tenants.has(id));
    // Separate reads (each record is its own cluster slot), sent together by auto-pipelining.
    const read = await Promise.all(missing.map((id) => this.redis.hget(keys.sandbox(id), 'tenant')));
    if (this.tenants.size + missing.length > MAX_TENANTS_CACHED) this.tenants.clear();
    missing.forEach((id, i) => read[i] && this.tenants.set(id, read[i]));
    return this.tenants;
  }
}
