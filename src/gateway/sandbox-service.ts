// Longer than most: one sandbox's whole lifecycle from the API side (create and its placement
// retries, pause, snapshot, policy, delete), which share their waits and reply handling.
import { createHash } from 'node:crypto';
import { RollboxError, isTerminal, newId, withImageDefaults, type CreateSandboxRequest, type ImageSpec, type JobActionResult, type Layer, type Lineage, type ListSandboxesQuery, type PauseRequest, type PolicyPatch, type Ran, type Reply, type RunOnce, type Sandbox, type SnapshotRequest } from '../api/index.ts';
import type { Config } from '../config/index.ts';
import { readerOf, requireScope, type Principal } from '../iam/index.ts';
import { chooseNode, type NodeDirectory, type PlacementRequest } from '../queues/index.ts';
import type { ImageRegistry, LayerRegistry, SandboxRegistry } from '../registry/index.ts';
import type { GatewayMetrics } from './metrics.ts';
import { checkTierSupports, networkUnavailable, placementOf, withDefaultRequests, type CreateRouting } from './placement-of.ts';
import type { PoolService } from './pool-service.ts';
import { settledOrThrow, toRollboxError, type NodeRequests } from './node-requests.ts';
import { countedCreate } from './create-metrics.ts';

export interface SandboxServiceDeps {
  config: Pick<Config, 'placement' | 'quota' | 'defaultRequests'> & { node: Pick<Config['node'], 'staleAfterMs' | 'pool'> };
  registry: SandboxRegistry;
  /** Snapshots register their layer; `image.base` resolves to an imported image's layers or a layer. */
  layers: Pick<LayerRegistry, 'register' | 'unpin'>;
  images: Pick<ImageRegistry, 'resolveStack'>;
  /** An `image.ref` becomes the `base` of the image holding it (pulled first, waited for). */
  /** Into the owner's images (a pull names them for the tenant that asked). */
  resolveImage: (spec: ImageSpec, owner: string) => Promise<ImageSpec>;
  directory: NodeDirectory;
  nodes: NodeRequests;
  metrics: Pick<GatewayMetrics, 'creates' | 'refusals' | 'seen'>;
  now: () => number;
  random: () => number;
  burst?: CreateRouting;
  /** Warm pools: a matching create takes a ready sandbox instead of starting one. */
  pools?: Pick<PoolService, 'claim' | 'giveBack'>;
}

/** A create whose image is resolved: what is admitted and started. */
export interface PreparedCreate {
  request: CreateSandboxRequest;
  layerDigests: string[];
  /** A fork's child: recorded on it. */
  lineage?: Lineage;
  /**
   * Started on this node or not at all (a fork's child whose disk is a clone of a fork
   * point there): no other node is tried, and no room there is `no_capacity`.
   */
  node?: string;
}

/** Lifecycle operations (destroy, pause, resume) take milliseconds; this bounds a lost reply. */
const LIFECYCLE_REPLY_TIMEOUT_MS = 30_000;
/** Packing a large writable layer takes a while (about the time to read it once). */
const SNAPSHOT_REPLY_TIMEOUT_MS = 10 * 60_000;
const POLL_MS = 25;
/** How often a waiting create checks that its node is still heartbeating. */
const NODE_CHECK_MS = 500;

/** Sandbox lifecycle behind the HTTP routes: placement, the create handshake, pause, delete. */
export class SandboxService {
  constructor(private readonly deps: SandboxServiceDeps) {}

  /** With `run`, the host runs it once the sandbox runs and discards the sandbox: `ran` is its result (none: the host was lost meanwhile). */
  async create(principal: Principal, request: CreateSandboxRequest, idempotencyKey: string | undefined, run?: RunOnce): Promise<{ sandbox: Sandbox; replayed: boolean; ran?: Ran }> {
    return countedCreate(this.deps, principal.tenant, request, async () => {
      requireScope(principal, 'sandbox:create');
      if (request.image.ref !== undefined) request = { ...request, image: await this.deps.resolveImage(request.image, principal.tenant) };
      const { layerDigests, image } = await this.deps.images.resolveStack(request.image, readerOf(principal));
      const resolved = { ...withImageDefaults(request, image?.config), resources: withDefaultRequests(request.resources, this.deps.config.defaultRequests) };
      return this.launch(principal, { request: resolved, layerDigests }, idempotencyKey, run);
    });
  }

  /**
   * A sandbox whose layers are already known (a fork's child): admitted and started as a
   * create is, never from a warm pool nor burst to the cloud (its layers are fresh).
   */
  async createPrepared(principal: Principal, prepared: PreparedCreate): Promise<Sandbox> {
    requireScope(principal, 'sandbox:create');
    const request = { ...prepared.request, resources: withDefaultRequests(prepared.request.resources, this.deps.config.defaultRequests) };
    return (await countedCreate(this.deps, principal.tenant, request, () => this.launch(principal, { ...prepared, request }, undefined))).sandbox;
  }

  private async launch(principal: Principal, prepared: PreparedCreate, idempotencyKey: string | undefined, run?: RunOnce): Promise<{ sandbox: Sandbox; replayed: boolean; ran?: Ran }> {
    const { registry, config, directory } = this.deps;
    const { request, layerDigests, lineage } = prepared;
    checkTierSupports(request);
    const local = { ...placementOf(request), pool: config.node.pool, exclude: new Set<string>(), ...(prepared.node !== undefined ? { only: prepared.node } : {}) };
    // A ready sandbox of a warm pool takes the place of a cold start: its id is the sandbox's.
    // Warm pools hold containers only.
    const claimed = lineage || request.tier === 'microvm' || request.allowPrivilegeEscalation ? undefined : await this.deps.pools?.claim(request, layerDigests, local);
    const id = claimed?.sandboxId ?? newId('sbx');
    // A node that joined since the last snapshot refresh should not mean "no capacity".
    const placeFresh = async (p: PlacementRequest) => this.place(p, id) ?? (await directory.refresh().then(() => this.place(p, id)));
    const routed = claimed
      ? { placement: local, node: claimed.nodeId }
      : this.deps.burst && !lineage
        ? await this.deps.burst.placeCreate(id, request, layerDigests, local, placeFresh)
        : { placement: local, node: this.place(local, id) ?? (await placeFresh(local)) };
    const placement = { ...routed.placement, exclude: new Set<string>() };
    const node = routed.node;
    if (!node) throw this.noNode(placement, `no worker host in pool ${placement.pool} can reserve ${placement.memoryMiB} MiB of memory and ${placement.diskMiB} MiB of disk now`);
    // A pool's claimed sandbox counts on its host too (a placement counted itself already).
    if (claimed) directory.assume(node, id, placement);

    const nowMs = this.deps.now();
    const record: Sandbox = { id, tenant: principal.tenant, state: 'pending', node, spec: request, layerDigests, createdAt: new Date(nowMs).toISOString(), oomKills: 0, ...(claimed ? { pool: claimed.pool } : {}), ...(lineage ? { lineage } : {}) };
    const requestHash = createHash('sha256').update(JSON.stringify(request)).digest('hex');
    const admitted = await registry.admit({
      record,
      maxLive: config.quota.maxLiveSandboxesPerTenant,
      idempotencyKey,
      requestHash,
      settleDeadlineMs: nowMs + 3 * config.placement.createTimeoutMs,
    });
    if (claimed && admitted.kind !== 'created') await this.deps.pools!.giveBack(claimed);
    if (admitted.kind === 'quota') {
      directory.forget(node, id);
      throw new RollboxError('quota_exceeded', `tenant ${principal.tenant} has ${admitted.liveCount} live sandboxes, the limit is ${config.quota.maxLiveSandboxesPerTenant}`, 10);
    }
    if (admitted.kind === 'exists') {
      if (admitted.requestHash !== requestHash) throw new RollboxError('conflict', 'Idempotency-Key was already used with a different request body');
      return { sandbox: await this.waitSettled(admitted.sandboxId, principal.tenant), replayed: true };
    }

    const started = await this.startOnNodes(id, principal.tenant, placement, node, `${id}.`, run);
    if (started.kind === 'started') return { sandbox: started.sandbox, replayed: false, ...(started.ran ? { ran: started.ran } : {}) };
    if (started.kind === 'timeout') return { sandbox: settledOrThrow(await this.onCreateTimeout(id, principal.tenant)), replayed: false };
    // Lost as it started, before this call answered: a new sandbox takes its place (and its Idempotency-Key).
    if (started.kind === 'lost') return registry.releaseIdempotencyKey(principal.tenant, idempotencyKey).then(() => this.launch(principal, prepared, idempotencyKey, run));
    await registry.transition(id, 'failed', { from: ['pending'], failureReason: 'admission_exhausted', detail: started.detail });
    await registry.releaseIdempotencyKey(principal.tenant, idempotencyKey);
    throw new RollboxError('admission_exhausted', started.detail, 5);
  }

  /**
   * The start handshake (a new sandbox, or a hibernated one coming back): ask a node,
   * re-place on refusal excluding the nodes that refused, stop after N refusals.
   */
  private async startOnNodes(
    id: string,
    tenant: string,
    placement: PlacementRequest & { exclude: Set<string> },
    firstNode: string,
    requestPrefix: string,
    run?: RunOnce,
  ): Promise<{ kind: 'started'; sandbox: Sandbox; ran?: Ran } | { kind: 'exhausted'; detail: string } | { kind: 'timeout' } | { kind: 'lost' }> {
    const { registry, config, directory } = this.deps;
    // Each node tried is counted as assumed load where it was chosen (place, or a pool's claim).
    for (let attempt = 0, node = firstNode; ; attempt++) {
      const requestId = `${requestPrefix}${attempt}`;
      const targetNode = node;
      const job = { sandboxId: id, attempt, requestId, ...(run ? { run } : {}) };
      const reply = await this.awaitCreateReply(requestId, targetNode, (timeoutMs) => this.deps.nodes.sendCreate(targetNode, job, timeoutMs + (run?.timeoutMs ?? 0))).catch((err: unknown) => err);
      if (reply instanceof RollboxError && reply.code === 'timeout') return { kind: 'timeout' };
      if (reply instanceof Error) throw reply;
      const r = reply as Reply;
      if (r.kind === 'created' || r.kind === 'ran') return { kind: 'started', sandbox: await registry.getOwned(id, tenant), ...(r.kind === 'ran' ? { ran: r } : {}) };
      if (r.kind === 'error') {
        const settled = settledOrThrow(await this.waitSettled(id, tenant));
        if (run) throw toRollboxError(r.error); // it started, and the run failed
        return { kind: 'started', sandbox: settled };
      }
      if (r.kind !== 'refused') throw new RollboxError('internal', `unexpected reply ${r.kind}`);

      directory.forget(r.nodeId, id);
      this.deps.metrics.refusals.inc({ node: r.nodeId });
      placement.exclude.add(r.nodeId);
      // A run whose host was lost once its sandbox started may have run: not placed again (the caller hears node_lost).
      const current = run && directory.isSilent(r.nodeId, config.node.staleAfterMs) ? await registry.getOwned(id, tenant) : undefined;
      if (current && current.state !== 'pending') return { kind: 'started', sandbox: current };
      const next = attempt + 1 < config.placement.maxRefusals ? this.place(placement, id) : undefined;
      if (!next) return { kind: 'exhausted', detail: `no worker host admitted sandbox ${id} after ${placement.exclude.size} refusals (last: ${r.reason})` };
      // A node lost before the sandbox ran (still creating there) loses it to the next one.
      const lost = directory.isSilent(r.nodeId, config.node.staleAfterMs);
      if (!(await registry.reassign(id, node, next, { fromCreating: lost }))) {
        const settled = await this.waitSettled(id, tenant);
        // It got to running there, and the host died before answering: nobody has its id yet.
        return lost && settled.state === 'failed' && settled.failureReason === 'lost' ? { kind: 'lost' } : { kind: 'started', sandbox: settledOrThrow(settled) };
      }
      node = next;
    }
  }

  /**
   * The node's reply to a create; a node that stops heartbeating while the request waits
   * counts as a refusal, so the request is placed elsewhere instead of waiting for the timeout.
   */
  private async awaitCreateReply(requestId: string, nodeId: string, send: (timeoutMs: number) => Promise<Reply>): Promise<Reply> {
    const reply = send(this.deps.config.placement.createTimeoutMs);
    for (;;) {
      const settled = await Promise.race([reply, new Promise<undefined>((r) => setTimeout(r, NODE_CHECK_MS))]);
      if (settled) return settled;
      if (this.deps.directory.isSilent(nodeId, this.deps.config.node.staleAfterMs)) {
        this.deps.nodes.cancel(requestId);
        return { kind: 'refused', requestId, nodeId, reason: `worker host ${nodeId} stopped heartbeating` };
      }
    }
  }

  /** Why no node took a request: the hosts' failing network self-tests when that is it, else no capacity. */
  private noNode(placement: PlacementRequest, noCapacity: string): RollboxError {
    return networkUnavailable(placement, this.deps.directory.candidates(), (p) => this.place(p)) ?? new RollboxError('no_capacity', noCapacity, 5);
  }

  /**
   * A node for the request; with `sandboxId`, its load is counted on that node in the same
   * step. Nothing may await between the two: thousands of creates sent at once reach this
   * point in one run of the microtask queue, and each must see the ones placed before it
   * (counted one hop later, a burst of 10,000 had been placed on one frozen view, as if at
   * random: its busiest host took 2.4 times the mean).
   */
  private place(request: PlacementRequest, sandboxId?: string): string | undefined {
    const { config, directory, random } = this.deps;
    const node = chooseNode(directory.candidates(), request, { choices: config.placement.choices, staleAfterMs: config.node.staleAfterMs, random })?.heartbeat.nodeId;
    if (node && sandboxId) directory.assume(node, sandboxId, request);
    return node;
  }

  private async onCreateTimeout(id: string, tenant: string): Promise<Sandbox> {
    const failed = await this.deps.registry.transition(id, 'failed', { from: ['pending'], failureReason: 'timeout', detail: 'no worker host picked the request up in time' });
    if (failed.kind === 'ok') throw new RollboxError('timeout', `sandbox ${id} was not started within ${this.deps.config.placement.createTimeoutMs} ms`, 5);
    return this.waitSettled(id, tenant);
  }

  /** Waits until a sandbox has left pending/creating (another request is creating it). */
  private async waitSettled(id: string, tenant: string): Promise<Sandbox> {
    const sandbox = await this.pollUntil(id, tenant, (s) => s.state !== 'pending' && s.state !== 'creating', this.deps.config.placement.createTimeoutMs * 2);
    if (sandbox.state === 'pending' || sandbox.state === 'creating') throw new RollboxError('timeout', `sandbox ${id} is still ${sandbox.state}`, 5);
    return sandbox;
  }

  /** The sandbox once `done(it)` holds, or as it is when `waitMs` has passed. */
  private async pollUntil(id: string, tenant: string, done: (sandbox: Sandbox) => boolean, waitMs: number): Promise<Sandbox> {
    const deadline = this.deps.now() + waitMs;
    for (;;) {
      const sandbox = await this.deps.registry.getOwned(id, tenant);
      if (done(sandbox) || this.deps.now() > deadline) return sandbox;
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  }

  async get(principal: Principal, id: string): Promise<Sandbox> {
    requireScope(principal, 'sandbox:read');
    return this.deps.registry.getOwned(id, principal.tenant);
  }

  async list(principal: Principal, query: ListSandboxesQuery): Promise<Sandbox[]> {
    requireScope(principal, 'sandbox:read');
    return this.deps.registry.list(principal.tenant, query);
  }

  /** Freeze (`pause`) or thaw (`resume`) one sandbox. */
  async setPaused(principal: Principal, id: string, paused: boolean, mode: PauseRequest['mode'] = 'freeze'): Promise<Sandbox> {
    requireScope(principal, 'sandbox:exec');
    return (await this.freezeOne(await this.deps.registry.getOwned(id, principal.tenant), paused, mode)).sandbox;
  }

  /** Pause or resume every live sandbox of a training job, across all worker hosts at once. */
  async setJobPaused(principal: Principal, job: string, paused: boolean, mode: PauseRequest['mode'] = 'freeze'): Promise<JobActionResult> {
    if (!principal.scopes.has('rollout:submit')) requireScope(principal, 'sandbox:exec'); // a hosted rollout's trainer pauses its job too
    const sandboxes = (await this.deps.registry.list(principal.tenant, { job, limit: 1000 })).filter((s) => !isTerminal(s.state));
    const results = await Promise.all(
      sandboxes.map(async (sandbox) => {
        try {
          const { sandbox: after, changed } = await this.freezeOne(sandbox, paused, mode);
          return { id: sandbox.id, node: sandbox.node, outcome: changed ? ('done' as const) : ('unchanged' as const), state: after.state };
        } catch (err) {
          const error = err instanceof RollboxError ? { code: err.code, message: err.message } : { code: 'internal', message: String(err) };
          return { id: sandbox.id, node: sandbox.node, outcome: 'failed' as const, state: sandbox.state, error };
        }
      }),
    );
    return { job, results };
  }

  private async freezeOne(sandbox: Sandbox, paused: boolean, mode: PauseRequest['mode']): Promise<{ sandbox: Sandbox; changed: boolean }> {
    if (!paused && sandbox.state === 'hibernated') return { sandbox: await this.wake(sandbox), changed: true };
    const target = paused ? (mode === 'hibernate' ? 'hibernated' : 'paused') : 'running';
    const swapFurther = paused && mode === 'swap' && sandbox.state === 'paused' && !sandbox.swapped; // a frozen sandbox may still page out
    if ((sandbox.state === target && !swapFurther) || (paused && sandbox.state === 'hibernated')) return { sandbox, changed: false };
    const allowed = paused ? (mode === 'freeze' ? ['running'] : ['running', 'paused']) : ['paused'];
    if (!allowed.includes(sandbox.state)) throw new RollboxError('invalid_state', `sandbox ${sandbox.id} is ${sandbox.state}; it cannot become ${target}`);
    const requestId = newId('req');
    const kind: 'pause' | 'resume' | 'hibernate' = paused ? (mode === 'hibernate' ? 'hibernate' : 'pause') : 'resume';
    const timeoutMs = kind === 'hibernate' || mode === 'swap' || sandbox.swapped ? SNAPSHOT_REPLY_TIMEOUT_MS : LIFECYCLE_REPLY_TIMEOUT_MS;
    const reply = await this.deps.nodes.sendOp(sandbox.node!, { kind, sandboxId: sandbox.id, requestId, ...(kind === 'pause' && mode === 'swap' ? { mode } : {}) }, timeoutMs);
    if (reply.kind === 'error') throw toRollboxError(reply.error);
    return { sandbox: await this.deps.registry.getOwned(sandbox.id, sandbox.tenant), changed: true };
  }

  /** A hibernated sandbox comes back on any node that can take it, from its packed writable layer. */
  private async wake(sandbox: Sandbox): Promise<Sandbox> {
    const placement = { ...placementOf(sandbox.spec), pool: this.deps.config.node.pool, exclude: new Set<string>() };
    const node = this.place(placement, sandbox.id) ?? (await this.deps.directory.refresh().then(() => this.place(placement, sandbox.id)));
    if (!node) throw this.noNode(placement, `no worker host can take sandbox ${sandbox.id} back now`);
    if (!(await this.deps.registry.reassign(sandbox.id, sandbox.node, node))) return this.waitSettled(sandbox.id, sandbox.tenant);
    const started = await this.startOnNodes(sandbox.id, sandbox.tenant, placement, node, `${sandbox.id}.wake${this.deps.now()}.`);
    if (started.kind === 'started') return started.sandbox;
    // Still hibernated: nothing was lost, the caller may try again.
    if (started.kind === 'timeout') throw new RollboxError('timeout', `sandbox ${sandbox.id} did not come back in time; it stays hibernated`, 5);
    if (started.kind === 'lost') throw new RollboxError('node_lost', `the worker host waking sandbox ${sandbox.id} stopped heartbeating`, 1);
    throw new RollboxError('admission_exhausted', started.detail, 5);
  }

  /**
   * pack_diff: the sandbox's writable layer becomes a new layer whose parents are the
   * sandbox's layers, without the excluded paths and those its current stage hides. A
   * builder's scope, distinct from the runtime agent's.
   */
  async snapshot(principal: Principal, id: string, request: SnapshotRequest): Promise<Layer> {
    requireScope(principal, 'sandbox:snapshot');
    const sandbox = await this.deps.registry.getOwned(id, principal.tenant);
    if (sandbox.state !== 'running' && sandbox.state !== 'paused') throw new RollboxError('invalid_state', `sandbox ${id} is ${sandbox.state}; only a running or paused sandbox can be snapshotted`);
    const requestId = newId('req');
    // What the sandbox's current stage hides (grader files, reference answers) stays out of what it leaves behind.
    const exclude = [...new Set([...request.exclude, ...sandbox.spec.hiddenPaths])];
    const reply = await this.deps.nodes.sendOp(sandbox.node!, { kind: 'snapshot', sandboxId: id, requestId, exclude }, SNAPSHOT_REPLY_TIMEOUT_MS);
    if (reply.kind === 'error') throw toRollboxError(reply.error);
    if (reply.kind !== 'snapshot') throw new RollboxError('internal', `unexpected reply ${reply.kind}`);
    const layer = await this.deps.layers.register({ digest: reply.digest, sizeBytes: reply.sizeBytes, name: request.name, parents: sandbox.layerDigests, createdAt: new Date(this.deps.now()).toISOString() }, sandbox.tenant);
    await this.deps.layers.unpin(layer.digest); // recorded: garbage collection may judge it now
    return layer;
  }

  /**
   * A new task stage: network and hidden paths change in the running sandbox (its node
   * applies them, then records them), or only in the record of a hibernated one (applied
   * when it wakes). An operator's action, not the agent's: its own scope.
   */
  async setPolicy(principal: Principal, id: string, patch: PolicyPatch): Promise<Sandbox> {
    requireScope(principal, 'sandbox:policy');
    const sandbox = await this.deps.registry.getOwned(id, principal.tenant);
    const change = { network: patch.network, hiddenPaths: patch.hiddenPaths };
    if (sandbox.state === 'hibernated') {
      // Applied when it wakes; only while it is still hibernated (a wake reads the spec).
      const patched = await this.deps.registry.patchSpec(id, change, ['hibernated']);
      if (patched) return patched;
      return this.setPolicy(principal, id, patch); // it began to wake meanwhile: go by its new state
    }
    if (sandbox.state !== 'running' && sandbox.state !== 'paused') throw new RollboxError('invalid_state', `sandbox ${id} is ${sandbox.state}; a policy changes only in a running, paused or hibernated sandbox`);
    const reply = await this.deps.nodes.sendOp(sandbox.node!, { kind: 'policy', sandboxId: id, requestId: newId('req'), ...change }, LIFECYCLE_REPLY_TIMEOUT_MS);
    if (reply.kind === 'error') throw toRollboxError(reply.error);
    return this.deps.registry.getOwned(id, principal.tenant);
  }

  async delete(principal: Principal, id: string): Promise<Sandbox> {
    requireScope(principal, 'sandbox:delete');
    const { registry } = this.deps;
    const sandbox = await registry.getOwned(id, principal.tenant);
    if (isTerminal(sandbox.state)) return sandbox;
    // Not started yet: end it here; the node's pending->creating move will then be refused.
    if ((await registry.transition(id, 'terminated', { from: ['pending'], detail: 'deleted before it started' })).kind === 'ok') return registry.getOwned(id, principal.tenant);
    const stopping = await registry.transition(id, 'stopping', { from: ['creating', 'running', 'paused', 'hibernated'] });
    if (stopping.kind === 'ok' && (stopping.from === 'creating' || stopping.from === 'hibernated')) {
      // A create in flight finishes the delete itself; a hibernated sandbox has nothing running.
      if (stopping.from === 'hibernated') await registry.transition(id, 'terminated', { from: ['stopping'] });
      return this.waitTerminal(id, principal.tenant);
    }
    const requestId = newId('req');
    // The node's reply is the fast path; the registry is the truth (a lost node's sandboxes
    // are ended by the janitor, and the node itself ends a sandbox it finds `stopping`).
    const reply = this.deps.nodes.sendOp(sandbox.node!, { kind: 'destroy', sandboxId: id, requestId }, LIFECYCLE_REPLY_TIMEOUT_MS);
    const first = await Promise.race([reply.catch(() => undefined), this.waitTerminal(id, principal.tenant)]);
    this.deps.nodes.cancel(requestId);
    if (first && 'kind' in first && first.kind === 'error') throw toRollboxError(first.error);
    return this.waitTerminal(id, principal.tenant);
  }

  private waitTerminal(id: string, tenant: string): Promise<Sandbox> {
    return this.pollUntil(id, tenant, (s) => isTerminal(s.state), LIFECYCLE_REPLY_TIMEOUT_MS);
  }
}
