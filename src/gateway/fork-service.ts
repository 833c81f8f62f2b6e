import { createHash } from 'node:crypto';
import { MAX_STACK_LAYERS, Resources, RollboxError, newId, type CreateSandboxRequest, type Reply, type ForkChild, type ForkRequest, type ForkResult, type Lineage, type Sandbox, type SnapshotForkRequest } from '../api/index.ts';
import { readerOf, requireScope, type Principal } from '../iam/index.ts';
import type { LayerStore } from '../layers/index.ts';
import type { ForkRecords, LayerRegistry, SandboxRegistry } from '../registry/index.ts';
import { toRollboxError, type NodeRequests } from './node-requests.ts';
import type { ForkPoint } from './fork-point.ts';
import { keepsProcessesByDefault, vmForkPointOf } from './vm-fork.ts';
import type { PreparedCreate, SandboxService } from './sandbox-service.ts';

export interface ForkServiceDeps {
  registry: Pick<SandboxRegistry, 'getOwned'>;
  layers: Pick<LayerRegistry, 'register' | 'get' | 'visible' | 'pin' | 'unpin'>;
  forks: Pick<ForkRecords, 'claim' | 'read' | 'complete' | 'release'>;
  nodes: Pick<NodeRequests, 'sendOp'>;
  sandboxes: Pick<SandboxService, 'createPrepared'>;
  /** The layer store, where forks that keep processes keep their image while the children start (vm-fork.ts). */
  store: Pick<LayerStore, 'linkForkImage' | 'removeForkImage' | 'forkImageDirOf'>;
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
/** Making a fork point (a sync, then a clone under a freeze) or removing one. */
const FORK_POINT_REPLY_TIMEOUT_MS = 60_000;
/** A fork layer in use by nobody yet is kept from garbage collection this long while its children are made. */
const FORK_PIN_MS = 30 * 60_000;
/** A re-sent fork waits this long for the first request's children to settle. */
const REPLAY_WAIT_MS = 10 * 60_000;
const REPLAY_POLL_MS = 100;

type Packed = { digest: string; frozenMs?: number };

/**
 * Fork: N children from one sandbox's current state (or from a snapshot), each a sandbox
 * of its own placed and admitted as any create is (so counted against the quota, and
 * refused for capacity alone). A running or paused container parent is frozen only while
 * its disk is cloned into a fork point (scratch.ts); children on its host start from
 * clones of that, sharing its blocks, with nothing packed or copied. Children elsewhere
 * (no room on the parent's host, or a host that cannot clone) stack the parent's writable
 * layer packed once into ONE read-only layer. Those children carry files, not processes.
 * A microVM parent forks with its processes by default: saved whole once, each child
 * restored from that image on any host sharing the layer store (vm-fork.ts).
 */
export class ForkService {
  constructor(private readonly deps: ForkServiceDeps) {}

  async forkSandbox(principal: Principal, id: string, request: ForkRequest, idempotencyKey: string | undefined): Promise<{ result: ForkResult; replayed: boolean }> {
    requireScope(principal, 'sandbox:create');
    return this.idempotent(principal, idempotencyKey, { sandbox: id, request }, async () => {
      const parent = await this.deps.registry.getOwned(id, principal.tenant);
      const { count, resources, snapshot, processes, ...overrides } = request;
      const childResources = resourcesOf(parent, resources); // checked before the parent is frozen
      const spec = { ...parent.spec, ...overrides, resources: childResources };
      if (processes ?? keepsProcessesByDefault(parent)) {
        // One save of the parent whole, restored N times (vm-fork.ts); the image goes once every child started (or failed to).
        const fp = newId('fp');
        try {
          const point = await vmForkPointOf(this.deps, parent, fp, spec, snapshot !== undefined);
          return await this.makeChildren(principal, spec, count, point, undefined);
        } finally {
          await this.deps.store.removeForkImage(fp).catch(() => undefined); // else layer GC takes it
        }
      }
      if (parent.layerDigests.length + 1 > MAX_STACK_LAYERS) throw new RollboxError('invalid_request', `sandbox ${id} stacks ${parent.layerDigests.length} layers; its children would stack one more than the ${MAX_STACK_LAYERS} a sandbox may`);
      const point = await this.forkPointOf(parent, childResources.diskMiB === parent.spec.resources.diskMiB);
      try {
        return await this.makeChildren(principal, spec, count, point, snapshot);
      } finally {
        if (point.clone) await this.forkPointOp(point.clone, 'remove').catch(() => undefined); // else it goes by itself on its host
      }
    });
  }

  async forkSnapshot(principal: Principal, digest: string, request: SnapshotForkRequest, idempotencyKey: string | undefined): Promise<{ result: ForkResult; replayed: boolean }> {
    requireScope(principal, 'sandbox:create');
    return this.idempotent(principal, idempotencyKey, { snapshot: digest, request }, async () => {
      // Another tenant's snapshot is not found, as one that does not exist.
      const layer = (await this.deps.layers.visible(readerOf(principal), digest)) ? await this.deps.layers.get(digest) : undefined;
      if (!layer) throw new RollboxError('not_found', `snapshot ${digest} not found`);
      const layerDigests = [...layer.parents, layer.digest];
      if (layerDigests.length > MAX_STACK_LAYERS) throw new RollboxError('invalid_request', `snapshot ${digest} stacks ${layerDigests.length} layers; a sandbox stacks at most ${MAX_STACK_LAYERS}`);
      const { count, ...rest } = request;
      const spec: CreateSandboxRequest = { ...rest, image: { base: layer.parents[0] ?? layer.digest, layers: layer.parents.slice(1) } };
      return this.makeChildren(principal, spec, count, { parent: digest, parentKind: 'snapshot', parentLayers: layer.parents, layer: async () => digest, packed: () => true }, undefined);
    });
  }

  /**
   * The fork point of a live parent. Running or paused: a clone of its disk where its host
   * can clone (and the children keep its disk size), else its writable layer packed now
   * (frozen while mkfs reads it; a paused one stays paused). Hibernated: the layer its
   * hibernation packed is that state already.
   */
  private async forkPointOf(parent: Sandbox, sameDisk: boolean): Promise<ForkPoint> {
    const { deps } = this;
    const base = { parent: parent.id, parentKind: 'sandbox' as const, parentLayers: parent.layerDigests };
    // Its image holds its disk as the guest wrote it, which the host never mounts or packs.
    if (parent.state === 'hibernated' && parent.hibernatedWhole) throw new RollboxError('tier_unsupported', `sandbox ${parent.id} is a microVM hibernated whole: it forks with its processes (processes: true), or wake it first to fork its files only`);
    if (parent.state === 'hibernated' && parent.hibernationLayer) {
      // Pinned: the parent may wake meanwhile and let go of it before a child holds it.
      const digest = parent.hibernationLayer;
      await deps.layers.pin(digest, deps.now() + FORK_PIN_MS);
      return { ...base, layer: async () => digest, packed: () => true };
    }
    if (parent.state !== 'running' && parent.state !== 'paused') {
      const why = parent.state === 'pending' || parent.state === 'creating' ? 'it has not started yet' : 'it is ending or ended';
      throw new RollboxError('invalid_state', `sandbox ${parent.id} is ${parent.state}; only a running, paused or hibernated sandbox forks (${why})`);
    }
    const clone = sameDisk ? { node: parent.node!, id: newId('fp'), parentId: parent.id } : undefined;
    const made = clone ? await this.forkPointOp(clone, 'make') : undefined;
    if (made?.kind === 'error') throw toRollboxError(made.error);
    if (made?.kind === 'fork_point' && made.cloned) {
      let packing: Promise<Packed> | undefined;
      const layer = async () => (await (packing ??= this.packed(parent, this.forkPointOp(clone!, 'pack')))).digest;
      return { ...base, clone, layer, packed: () => packing !== undefined, ...(made.frozenMs !== undefined ? { frozenMs: made.frozenMs } : {}) };
    }
    // This host cannot clone disks: the writable layer packed, as a snapshot is.
    const requestId = `fork-${parent.id}-${deps.now()}-${Math.random().toString(36).slice(2, 8)}`;
    const packed = await this.packed(parent, deps.nodes.sendOp(parent.node!, { kind: 'snapshot', sandboxId: parent.id, requestId, exclude: [] }, PACK_REPLY_TIMEOUT_MS));
    return { ...base, layer: async () => packed.digest, packed: () => true, ...(packed.frozenMs !== undefined ? { frozenMs: packed.frozenMs } : {}) };
  }

  private forkPointOp(clone: NonNullable<ForkPoint['clone']>, action: 'make' | 'pack' | 'remove'): Promise<Reply> {
    const requestId = `${clone.id}-${action}-${Math.random().toString(36).slice(2, 8)}`;
    return this.deps.nodes.sendOp(clone.node, { kind: 'fork_point', action, sandboxId: clone.parentId, forkPointId: clone.id, requestId }, action === 'pack' ? PACK_REPLY_TIMEOUT_MS : FORK_POINT_REPLY_TIMEOUT_MS);
  }

  /** A packed writable layer, recorded with its lineage (parents) like a snapshot, and like one pinned by the worker that packed it. */
  private async packed(parent: Sandbox, pack: Promise<Reply>): Promise<Packed> {
    const reply = await pack;
    if (reply.kind === 'error') throw toRollboxError(reply.error);
    if (reply.kind !== 'snapshot') throw new RollboxError('internal', `unexpected reply ${reply.kind}`);
    await this.deps.layers.register({ digest: reply.digest, sizeBytes: reply.sizeBytes, parents: parent.layerDigests, createdAt: new Date(this.deps.now()).toISOString() }, parent.tenant);
    return { digest: reply.digest, ...(reply.frozenMs !== undefined ? { frozenMs: reply.frozenMs } : {}) };
  }

  /** Every child at once, each created or refused on its own; none created: the first refusal is the answer. */
  private async makeChildren(principal: Principal, spec: CreateSandboxRequest, count: number, point: ForkPoint, snapshot: ForkRequest['snapshot']): Promise<ForkResult> {
    const forkedAt = new Date(this.deps.now()).toISOString();
    const forkPoint = point.clone?.id ?? point.processes?.id;
    const lineage: Lineage = { parent: point.parent, parentKind: point.parentKind, ...(forkPoint ? { forkPoint } : {}), forkedAt };
    const kept = snapshot ? point.layer() : undefined; // beside the children, not after them
    const errors: RollboxError[] = [];
    const create = async (prepared: PreparedCreate): Promise<ForkChild> => {
      const child = await this.deps.sandboxes.createPrepared(principal, prepared);
      return { id: child.id, state: child.state, ...(child.state === 'failed' ? { error: { code: 'internal', message: child.detail ?? `child ${child.id} failed (${child.failureReason ?? 'unknown'})` } } : {}) };
    };
    const makeChild = async (): Promise<ForkChild> => {
      try {
        // Restored from the fork's image on any host that shares the layer store: placed as any create.
        if (point.processes) return await create({ request: spec, layerDigests: point.parentLayers, lineage: { ...lineage, processes: true } });
        if (point.clone) {
          try {
            return await create({ request: spec, layerDigests: point.parentLayers, lineage, node: point.clone.node });
          } catch (err) {
            if (!(err instanceof RollboxError && err.code === 'no_capacity')) throw err; // no room beside the parent: a host that can take the layer
          }
        }
        const forkLayer = await point.layer();
        // (A snapshot with no parents is the base itself.)
        const image = spec.image.base === forkLayer ? spec.image : { ...spec.image, layers: [...spec.image.layers, forkLayer] };
        return await create({ request: { ...spec, image }, layerDigests: [...point.parentLayers, forkLayer], lineage: { ...lineage, forkLayer } });
      } catch (err) {
        const error = err instanceof RollboxError ? err : new RollboxError('internal', err instanceof Error ? err.message : String(err));
        errors.push(error);
        return { error: { code: error.code, message: error.message } };
      }
    };
    const children = await Promise.all(Array.from({ length: count }, makeChild));
    const forkLayer = point.packed() ? await point.layer().catch(() => undefined) : undefined;
    if (kept) await kept; // its failure is the fork's: the caller asked for it
    // The children (live ones count as references) or the snapshot's name hold the layer now; if none does, garbage collection takes it.
    if (forkLayer) {
      if (snapshot?.name) await this.deps.layers.register({ ...(await this.deps.layers.get(forkLayer))!, name: snapshot.name }, principal.tenant);
      if (point.parentKind === 'sandbox') await this.deps.layers.unpin(forkLayer);
    }
    const created = children.filter((c) => c.state === 'running').length;
    if (created === 0 && errors[0]) throw errors[0];
    return {
      parent: point.parent,
      parentKind: point.parentKind,
      ...(forkPoint ? { forkPoint } : {}),
      ...(forkLayer ? { forkLayer } : {}),
      forkedAt,
      ...(point.frozenMs !== undefined ? { parentFrozenMs: point.frozenMs } : {}),
      processes: point.processes !== undefined,
      ...(point.processes ? { detachedCommands: point.processes.detachedCommands } : {}),
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
