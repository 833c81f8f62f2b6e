import { RollboxError, newId, type Sandbox } from '../api/index.ts';
import { requireScope, type Principal } from '../iam/index.ts';
import type { SandboxRegistry } from '../registry/index.ts';
import { toRollboxError, type NodeRequests } from './node-requests.ts';

export interface TtlServiceDeps {
  registry: SandboxRegistry;
  nodes: NodeRequests;
  now: () => number;
}

const TTL_REPLY_TIMEOUT_MS = 30_000;

/**
 * A sandbox's TTL, changed after its create: it now ends `ttlSeconds` from now. A running
 * or frozen sandbox's host holds its timer, so the host moves it (and records it); a
 * hibernated sandbox's TTL is watched in Redis (the janitor), so only the record moves.
 */
export class TtlService {
  constructor(private readonly deps: TtlServiceDeps) {}

  /** With `extendOnly`, a TTL that would end sooner than the current one leaves it as it is (E2B's connect). */
  async setTtl(principal: Principal, id: string, ttlSeconds: number, options: { extendOnly?: boolean } = {}): Promise<Sandbox> {
    requireScope(principal, 'sandbox:exec');
    const { registry, nodes } = this.deps;
    const sandbox = await registry.getOwned(id, principal.tenant);
    const atMs = this.deps.now() + ttlSeconds * 1000;
    if (options.extendOnly && Date.parse(sandbox.expiresAt ?? '') >= atMs) return sandbox;
    const expiresAt = new Date(atMs).toISOString();
    if (sandbox.state === 'hibernated') {
      if (!(await registry.setExpiresAt(id, expiresAt))) throw new RollboxError('invalid_state', `sandbox ${id} ended meanwhile`);
      await registry.watchHibernatedTtl(id, atMs);
    } else if (sandbox.state === 'running' || sandbox.state === 'paused') {
      const reply = await nodes.sendOp(sandbox.node!, { kind: 'ttl', sandboxId: id, requestId: newId('req'), expiresAt }, TTL_REPLY_TIMEOUT_MS);
      if (reply.kind === 'error') throw toRollboxError(reply.error);
    } else {
      throw new RollboxError('invalid_state', `sandbox ${id} is ${sandbox.state}; a TTL changes only while it is running, paused or hibernated`);
    }
    return registry.getOwned(id, principal.tenant);
  }
}
