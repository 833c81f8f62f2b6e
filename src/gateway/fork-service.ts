import { createHash } from 'node:crypto';
import { MAX_STACK_LAYERS, Resources, RollboxError, type CreateSandboxRequest, type ForkChild, type ForkRequest, type ForkResult, type Lineage, type Sandbox, type SnapshotForkRequest } from '../api/index.ts';
import { requireScope, type Principal } from '../iam/index.ts';
import type { ForkRecords, LayerRegistry, SandboxRegistry } from '../registry/index.ts';
import { toRollboxError, type NodeRequests } from './node-requests.ts';
import type { SandboxService } from './sandbox-service.ts';

export interface ForkServiceDeps {
  registry: Pick<SandboxRegistry, 'getOwned'>;
  layers: Pick<LayerRegistry, 'register' | 'get' | 'pin' | 'unpin'>;
  forks: Pick<ForkRecords, 'claim' | 'read' | 'complete' | 'release'>;
  nodes: Pick<NodeRequests, 'sendOp'>;
  sandboxes: Pick<SandboxService, 'createPrepared'>;
  now: () => number;
}

/** The parent's limits with the ones given in their place; requests within the limits. */
function resourcesOf(parent: Sandbox, overrides: ForkRequest['resources']): Resources {
  if (!overrides) return parent.spec.resources;
  const merged = Resources.safeParse({ ...parent.spec.resources, ...Object.fromEntries(Object.entries(overrides).filter(([, v]) => v !== undefined)) });
  if (!merged.success) throw new RollboxError('invalid_request', `body.resources: ${merged.error.issues.map((i) => i.message).join('; ')} (the parent's, with the ones given: ${JSON.stringify(overrides)})`);
  return merged.data;
}

/** Packing a writable layer takes about the time to read it once (as a snapshot does). */
const PACK_REPLY_TIMEOUT_MS = 10 * 60_000;
/** A fork layer in use by nobody yet is kept from garbage collection this long while its children are made. */
const FORK_PIN_MS = 30 * 60_000;
/** A re-sent fork waits this long for the first request's children to settle. */
const REPLAY_WAIT_MS = 10 * 60_000;
const REPLAY_POLL_MS = 100;

/** The frozen state children start from: the layers under them, top one the fork layer. */
interface ForkPoint {
  parent: string;
  parentKind: Lineage['parentKind'];
  layerDigests: string[];
  forkLayer: string;
  frozenMs?: number;
  /** Pinned here for the fork, unpinned once the children reference it. */
  pinned: boolean;
}

/**
 * Fork: N children from one sandbox's current state (or from a snapshot). The parent's
 * writable layer is packed once, frozen only while it is read, into ONE read-only layer;
 * each child is a sandbox over the parent's layers plus that layer, with its own writable
 * layer, placed and admitted as any create is (so each one is counted against the quota
 * and may be refused for capacity alone). Children carry files, not processes.
 */
export class ForkService {
  constructor(private readonly deps: ForkServiceDeps) {}

  async forkSandbox(principal: Principal, id: string, request: ForkRequest, idempotencyKey: string | undefined): Promise<{ result: ForkResult; replayed: boolean }> {
    requireScope(principal, 'sandbox:create');
    return this.idempotent(principal, idempotencyKey, { sandbox: id, request }, async () => {
      const parent = await this.deps.registry.getOwned(id, principal.tenant);
      if (parent.layerDigests.length + 1 > MAX_STACK_LAYERS) throw new RollboxError('invalid_request', `sandbox ${id} stacks ${parent.layerDigests.length} layers; its children would stack one more than the ${MAX_STACK_LAYERS} a sandbox may`);
      const { count, resources, ...overrides } = request;
      const childResources = resourcesOf(parent, resources); // checked before the parent is packed
      const point = await this.packParent(parent);
      const spec: CreateSandboxRequest = { ...parent.spec, ...overrides, resources: childResources, image: { ...parent.spec.image, layers: [...parent.spec.image.layers, point.forkLayer] } };
      return this.makeChildren(principal, spec, count, point);
    });
  }

  async forkSnapshot(principal: Principal, digest: string, request: SnapshotForkRequest, idempotencyKey: string | undefined): Promise<{ result: ForkResult; replayed: boolean }> {
    requireScope(principal, 'sandbox:create');
    return this.idempotent(principal, idempotencyKey, { snapshot: digest, request }, async () => {
      const layer = await this.deps.layers.get(digest);
      if (!layer) throw new RollboxError('not_found', `snapshot ${digest} not found`);
      const layerDigests = [...layer.parents, layer.digest];
      if (layerDigests.length > MAX_STACK_LAYERS) throw new RollboxError('invalid_request', `snapshot ${digest} stacks ${layerDigests.length} layers; a sandbox stacks at most ${MAX_STACK_LAYERS}`);
      const { count, ...rest } = request;
      const spec: CreateSandboxRequest = { ...rest, image: { base: layerDigests[0]!, layers: layerDigests.slice(1) } };
      return this.makeChildren(principal, spec, count, { parent: digest, parentKind: 'snapshot', layerDigests, forkLayer: digest, pinned: false });
    });
  }

  /**
   * The fork point of a live parent. Running or paused: its writable layer packed now
   * (frozen while mkfs reads it, thawed at once; a paused one stays paused). Hibernated:
   * the layer its hibernation packed is that state already.
   */
  private async packParent(parent: Sandbox): Promise<ForkPoint> {
    const { deps } = this;
    const base = { parent: parent.id, parentKind: 'sandbox' as const };
    if (parent.state === 'hibernated' && parent.hibernatedWhole) throw new RollboxError('tier_unsupported', `sandbox ${parent.id} is a microVM hibernated whole; the microvm tier cannot fork yet (docs/microvm.md)`);
    if (parent.state === 'hibernated' && parent.hibernationLayer) {
      // Pinned: the parent may wake meanwhile and let go of it before a child holds it.
      await deps.layers.pin(parent.hibernationLayer, deps.now() + FORK_PIN_MS);
      return { ...base, layerDigests: [...parent.layerDigests, parent.hibernationLayer], forkLayer: parent.hibernationLayer, pinned: true };
    }
    if (parent.state !== 'running' && parent.state !== 'paused') {
      const why = parent.state === 'pending' || parent.state === 'creating' ? 'it has not started yet' : 'it is ending or ended';
      throw new RollboxError('invalid_state', `sandbox ${parent.id} is ${parent.state}; only a running, paused or hibernated sandbox forks (${why})`);
    }
    const requestId = `fork-${parent.id}-${deps.now()}-${Math.random().toString(36).slice(2, 8)}`;
    const reply = await deps.nodes.sendOp(parent.node!, { kind: 'snapshot', sandboxId: parent.id, requestId, exclude: [] }, PACK_REPLY_TIMEOUT_MS);
    if (reply.kind === 'error') throw toRollboxError(reply.error);
    if (reply.kind !== 'snapshot') throw new RollboxError('internal', `unexpected reply ${reply.kind}`);
    // Recorded with its lineage (parents) like a snapshot, and like one pinned by the worker that packed it.
    await deps.layers.register({ digest: reply.digest, sizeBytes: reply.sizeBytes, parents: parent.layerDigests, createdAt: new Date(deps.now()).toISOString() });
    return { ...base, layerDigests: [...parent.layerDigests, reply.digest], forkLayer: reply.digest, ...(reply.frozenMs !== undefined ? { frozenMs: reply.frozenMs } : {}), pinned: true };
  }

  /** Every child at once, each created or refused on its own; none created: the first refusal is the answer. */
  private async makeChildren(principal: Principal, spec: CreateSandboxRequest, count: number, point: ForkPoint): Promise<ForkResult> {
    const forkedAt = new Date(this.deps.now()).toISOString();
    const lineage: Lineage = { parent: point.parent, parentKind: point.parentKind, forkLayer: point.forkLayer, forkedAt };
    const errors: RollboxError[] = [];
    const children = await Promise.all(
      Array.from({ length: count }, async (): Promise<ForkChild> => {
        try {
          const child = await this.deps.sandboxes.createPrepared(principal, { request: spec, layerDigests: point.layerDigests, lineage });
          return { id: child.id, state: child.state, ...(child.state === 'failed' ? { error: { code: 'internal', message: child.detail ?? `child ${child.id} failed (${child.failureReason ?? 'unknown'})` } } : {}) };
        } catch (err) {
          const error = err instanceof RollboxError ? err : new RollboxError('internal', err instanceof Error ? err.message : String(err));
          errors.push(error);
          return { error: { code: error.code, message: error.message } };
        }
      }),
    );
    // The children (live ones count as references) hold the layer now; if none does, garbage collection takes it.
    if (point.pinned) await this.deps.layers.unpin(point.forkLayer);
    const created = children.filter((c) => c.state === 'running').length;
    if (created === 0 && errors[0]) throw errors[0];
    return {
      parent: point.parent,
      parentKind: point.parentKind,
      forkLayer: point.forkLayer,
      forkedAt,
      ...(point.frozenMs !== undefined ? { parentFrozenMs: point.frozenMs } : {}),
      processes: false,
      children,
      created,
      refused: count - created,
    };
  }

  /** With an Idempotency-Key, a fork happens once: a re-sent request answers the same children (their states now). */
  private async idempotent(principal: Principal, key: string | undefined, body: unknown, fork: () => Promise<ForkResult>): Promise<{ result: ForkResult; replayed: boolean }> {
    if (!key) return { result: await fork(), replayed: false };
    const { forks } = this.deps;
    const requestHash = createHash('sha256').update(JSON.stringify(body)).digest('hex');
    const claim = await forks.claim(principal.tenant, key, requestHash);
    if (claim.kind === 'exists') {
      if (claim.requestHash !== requestHash) throw new RollboxError('conflict', 'Idempotency-Key was already used with a different request body');
      return { result: await this.replay(principal, key, requestHash, claim.result), replayed: true };
    }
    try {
      const result = await fork();
      await forks.complete(principal.tenant, key, requestHash, result);
      return { result, replayed: false };
    } catch (err) {
      await forks.release(principal.tenant, key);
      throw err;
    }
  }

  private async replay(principal: Principal, key: string, requestHash: string, first: ForkResult | undefined): Promise<ForkResult> {
    const deadline = this.deps.now() + REPLAY_WAIT_MS;
    let result = first;
    while (!result) {
      if (this.deps.now() > deadline) throw new RollboxError('timeout', `the fork first sent with Idempotency-Key ${key} has not finished; send it again later`, 5);
      await new Promise((r) => setTimeout(r, REPLAY_POLL_MS));
      const stored = await this.deps.forks.read(principal.tenant, key);
      // Released: the first request made nothing.
      if (stored?.requestHash !== requestHash) throw new RollboxError('conflict', `the fork first sent with Idempotency-Key ${key} failed; send it again`);
      result = stored.result;
    }
    const children = await Promise.all(
      result.children.map(async (child) => (child.id ? { ...child, state: (await this.deps.registry.getOwned(child.id, principal.tenant).catch(() => undefined))?.state ?? child.state } : child)),
    );
    return { ...result, children };
  }
}
