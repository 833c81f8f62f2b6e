import { createHash } from 'node:crypto';
import { RollboxError, type CreateSandboxRequest, type ImageSpec, type Pool, type PoolRecord, type PutPoolRequest } from '../api/index.ts';
import { readerOf, requireScope, type Principal } from '../iam/index.ts';
import { chooseNode, type NodeDirectory, type PlacementRequest } from '../queues/index.ts';
import type { ImageRegistry, PoolRegistry } from '../registry/index.ts';
import { withDefaultRequests } from './placement-of.ts';

export interface PoolServiceDeps {
  pools: PoolRegistry;
  /** A pool's image may be an imported one: its layers, then the pool's own. */
  images: Pick<ImageRegistry, 'resolveStack'>;
  /** A pool's `image.ref`: the image holding it (pulled first). */
  /** Into the owner's images (a pull names them for the tenant that asked). */
  resolveImage: (spec: ImageSpec, owner: string) => Promise<ImageSpec>;
  directory: Pick<NodeDirectory, 'candidates' | 'list'>;
  placement: { choices: number; staleAfterMs: number };
  /** Requests a pool's definition leaves out (what its ready sandboxes reserve). */
  defaultRequests: { memoryMiB: number; cpuMillis: number };
  now: () => number;
  random: () => number;
}

export interface PoolClaim {
  sandboxId: string;
  nodeId: string;
  pool: string;
  version: string;
}

/** How long a gateway uses its copy of the pool definitions before reading them again. */
const POOLS_CACHE_MS = 1000;
/** Hosts tried for a ready sandbox before the create goes cold. */
const CLAIM_TRIES = 3;

/**
 * Warm pools, gateway side: their definitions (admin), their status from the hosts'
 * heartbeats, and the claim a create makes before it would start a sandbox cold.
 */
export class PoolService {
  private cache: { atMs: number; pools: PoolRecord[] } | undefined;

  constructor(private readonly deps: PoolServiceDeps) {}

  async put(principal: Principal, name: string, request: PutPoolRequest): Promise<Pool> {
    requireScope(principal, 'admin');
    if (request.image.ref !== undefined) request = { ...request, image: await this.deps.resolveImage(request.image, principal.tenant) };
    const { layerDigests } = await this.deps.images.resolveStack(request.image, readerOf(principal));
    const existing = await this.deps.pools.get(name);
    const nowIso = new Date(this.deps.now()).toISOString();
    const spec = { ...request, resources: withDefaultRequests(request.resources, this.deps.defaultRequests), layerDigests };
    // The version names what the ready sandboxes are: a change of image, limits or class
    // makes the hosts replace them; a change of size alone does not.
    const version = createHash('sha256').update(JSON.stringify({ image: spec.image, layerDigests, resources: spec.resources, class: spec.class, diskMiB: spec.diskMiB })).digest('hex').slice(0, 16);
    const record: PoolRecord = { ...spec, name, version, createdAt: existing?.createdAt ?? nowIso, updatedAt: nowIso };
    await this.deps.pools.put(record);
    this.cache = undefined;
    return this.withStatus(record);
  }

  async get(principal: Principal, name: string): Promise<Pool> {
    requireScope(principal, 'admin');
    const record = await this.deps.pools.get(name);
    if (!record) throw new RollboxError('not_found', `no pool ${name}`);
    return this.withStatus(record);
  }

  async list(principal: Principal): Promise<Pool[]> {
    requireScope(principal, 'admin');
    return this.listAll();
  }

  /** Every pool with its status, for callers that checked their own scope (the console). */
  async listAll(): Promise<Pool[]> {
    return Promise.all((await this.deps.pools.list()).map((r) => this.withStatus(r)));
  }

  async delete(principal: Principal, name: string): Promise<void> {
    requireScope(principal, 'admin');
    if (!(await this.deps.pools.delete(name))) throw new RollboxError('not_found', `no pool ${name}`);
    this.cache = undefined;
  }

  /**
   * A ready sandbox for this create, if a pool serves it (same layers, disk and class):
   * hosts that report one are filtered and sampled like any placement, and the chosen
   * host's list is popped atomically. Undefined: no pool matches, or a miss (then the
   * create starts cold, as without pools).
   */
  async claim(request: CreateSandboxRequest, layerDigests: readonly string[], placement: PlacementRequest): Promise<PoolClaim | undefined> {
    const pool = (await this.definitions()).find((p) => matches(p, request, layerDigests));
    if (!pool) return undefined;
    const exclude = new Set(placement.exclude);
    for (let attempt = 0; attempt < CLAIM_TRIES; attempt++) {
      const holding = this.deps.directory.candidates().filter((c) => (c.heartbeat.pools?.[pool.name]?.version === pool.version && c.heartbeat.pools[pool.name]!.ready > 0) || false);
      const node = chooseNode(holding, { ...placement, exclude }, { ...this.deps.placement, random: this.deps.random })?.heartbeat.nodeId;
      if (!node) break;
      const sandboxId = await this.deps.pools.claim(pool, node, attempt === CLAIM_TRIES - 1);
      if (sandboxId) return { sandboxId, nodeId: node, pool: pool.name, version: pool.version };
      exclude.add(node);
    }
    await this.deps.pools.recordMiss(pool.name);
    return undefined;
  }

  /** A claimed sandbox the create did not use after all (quota, an idempotent replay): ready again. */
  async giveBack(claim: PoolClaim): Promise<void> {
    await this.deps.pools.offer({ name: claim.pool, version: claim.version }, claim.nodeId, claim.sandboxId);
  }

  private async definitions(): Promise<PoolRecord[]> {
    const now = this.deps.now();
    if (!this.cache || now - this.cache.atMs > POOLS_CACHE_MS) this.cache = { atMs: now, pools: await this.deps.pools.list() };
    return this.cache.pools;
  }

  private async withStatus(record: PoolRecord): Promise<Pool> {
    const hosts = this.deps.directory
      .list()
      .filter((n) => n.healthy && n.pools?.[record.name]?.version === record.version)
      .map((n) => ({ nodeId: n.nodeId, ready: n.pools![record.name]!.ready, starting: n.pools![record.name]!.starting }));
    const { claims, misses } = await this.deps.pools.lastMinute(record.name);
    return {
      ...record,
      status: {
        target: record.size * hosts.length,
        ready: hosts.reduce((n, h) => n + h.ready, 0),
        starting: hosts.reduce((n, h) => n + h.starting, 0),
        hosts,
        claimsPerMinute: claims,
        missesPerMinute: misses,
      },
    };
  }
}

/** A pool serves a create of the same layers, disk and class; limits, env and the rest are bound at the claim. */
function matches(pool: PoolRecord, request: CreateSandboxRequest, layerDigests: readonly string[]): boolean {
  return pool.class === request.class && pool.diskMiB === request.resources.diskMiB && pool.layerDigests.length === layerDigests.length && pool.layerDigests.every((d, i) => d === layerDigests[i]);
}

