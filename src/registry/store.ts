import type { Redis } from 'ioredis';
import {
  RollboxError,
  STATE_TRANSITIONS,
  isTerminal,
  type FailureReason,
  type ListSandboxesQuery,
  type Sandbox,
  type SandboxState,
  SandboxState as SandboxStateSchema,
  CreateSandboxRequest,
  Lineage,
} from '../api/index.ts';
import { keys } from './keys.ts';
import { LuaScript } from '../redis/index.ts';
import { SignalStore, observationFields } from './signals.ts';

// Each state change is one script (KEYS, ARGV and answers in its file's header).
const ADMIT_SANDBOX = new LuaScript(import.meta.dirname, 'admit-sandbox');
const TRANSITION = new LuaScript(import.meta.dirname, 'transition-sandbox');
const REASSIGN = new LuaScript(import.meta.dirname, 'reassign-sandbox');
const SET_SPEC = new LuaScript(import.meta.dirname, 'set-sandbox-spec');
const SET_EXPIRES_AT = new LuaScript(import.meta.dirname, 'set-sandbox-expiry');
const COUNT_LAYER_REFS = new LuaScript(import.meta.dirname, 'count-layer-refs');

/** Idempotency keys are remembered this long. */
const IDEMPOTENCY_TTL_SEC = 24 * 3600;
/** Terminal records stay readable this long. */
const TERMINAL_RECORD_TTL_SEC = 24 * 3600;

export type AdmitOutcome =
  | { kind: 'created' }
  | { kind: 'exists'; sandboxId: string; requestHash: string }
  | { kind: 'quota'; liveCount: number };

export type TransitionOutcome = { kind: 'ok'; from: SandboxState } | { kind: 'refused'; current: SandboxState } | { kind: 'missing' };

export interface TransitionOptions {
  /** Only move if the sandbox is currently in one of these (defaults to every legal origin). */
  from?: readonly SandboxState[];
  /** Only move if the sandbox is assigned to this node (fences a worker that lost it). */
  node?: string;
  failureReason?: FailureReason;
  detail?: string;
  startedAt?: string;
  expiresAt?: string;
  /** The packed writable layer of a hibernated sandbox; '' clears it (woken). */
  hibernationLayer?: string;
}

/** States from which `to` may be entered. */
function legalOrigins(to: SandboxState): SandboxState[] {
  return SandboxStateSchema.options.filter((from) => STATE_TRANSITIONS[from].includes(to));
}

function toFields(record: Sandbox): string[] {
  const fields: Record<string, string | undefined> = {
    id: record.id,
    tenant: record.tenant,
    state: record.state,
    failureReason: record.failureReason,
    detail: record.detail,
    node: record.node,
    spec: JSON.stringify(record.spec),
    layerDigests: JSON.stringify(record.layerDigests),
    hibernationLayer: record.hibernationLayer,
    createdAt: record.createdAt,
    startedAt: record.startedAt,
    endedAt: record.endedAt,
    expiresAt: record.expiresAt,
    oomKills: String(record.oomKills),
    pool: record.pool,
    lineage: record.lineage && JSON.stringify(record.lineage),
  };
  return Object.entries(fields).flatMap(([k, v]) => (v === undefined ? [] : [k, v]));
}

function fromHash(hash: Record<string, string>): Sandbox | undefined {
  if (!hash.id) return undefined;
  return {
    id: hash.id,
    tenant: hash.tenant!,
    state: hash.state as SandboxState,
    failureReason: hash.failureReason as FailureReason | undefined,
    detail: hash.detail,
    node: hash.node,
    spec: CreateSandboxRequest.parse(JSON.parse(hash.spec!)),
    layerDigests: JSON.parse(hash.layerDigests ?? '[]') as string[],
    hibernationLayer: hash.hibernationLayer || undefined,
    createdAt: hash.createdAt!,
    startedAt: hash.startedAt,
    endedAt: hash.endedAt,
    expiresAt: hash.expiresAt,
    oomKills: Number(hash.oomKills ?? 0),
    ...(hash.pool ? { pool: hash.pool } : {}),
    ...(hash.lineage ? { lineage: Lineage.parse(JSON.parse(hash.lineage)) } : {}),
  };
}

/**
 * The sandbox registry in Redis: records, tenant quotas, idempotency keys and the
 * node -> sandboxes index. Shared by every gateway and worker host.
 */
export class SandboxRegistry {
  constructor(
    private readonly redis: Redis,
    private readonly now: () => number = Date.now,
  ) {}

  async admit(input: { record: Sandbox; maxLive: number; idempotencyKey?: string; requestHash: string; settleDeadlineMs: number }): Promise<AdmitOutcome> {
    const { record } = input;
    const idemKey = input.idempotencyKey ? keys.idempotency(record.tenant, input.idempotencyKey) : '';
    const result = (await ADMIT_SANDBOX.run(
      this.redis,
      [keys.sandbox(record.id), keys.tenantLive(record.tenant), keys.tenantAll(record.tenant), idemKey, record.node ? keys.nodeSandboxes(record.node) : '', keys.unsettled, keys.layerRefs],
      [
        record.id,
        record.tenant,
        String(input.maxLive),
        String(Date.parse(record.createdAt)),
        `${record.id}|${input.requestHash}`,
        String(input.settleDeadlineMs),
        String(IDEMPOTENCY_TTL_SEC),
        ...toFields(record),
      ],
    )) as string[];
    if (result[0] === 'created') return { kind: 'created' };
    if (result[0] === 'quota') return { kind: 'quota', liveCount: Number(result[1]) };
    const [sandboxId = '', requestHash = ''] = (result[1] ?? '').split('|');
    return { kind: 'exists', sandboxId, requestHash };
  }

  async get(id: string): Promise<Sandbox | undefined> {
    return fromHash(await this.redis.hgetall(keys.sandbox(id)));
  }

  /** A sandbox of this tenant; another tenant's sandbox is indistinguishable from a missing one. */
  async getOwned(id: string, tenant: string): Promise<Sandbox> {
    const sandbox = await this.get(id);
    if (!sandbox || sandbox.tenant !== tenant) throw new RollboxError('not_found', `sandbox ${id} not found`);
    return sandbox;
  }

  async transition(id: string, to: SandboxState, options: TransitionOptions = {}): Promise<TransitionOutcome> {
    const origins = legalOrigins(to).filter((s) => !options.from || options.from.includes(s));
    const terminal = isTerminal(to);
    const patch: string[] = [];
    if (options.failureReason) patch.push('failureReason', options.failureReason);
    if (options.detail) patch.push('detail', options.detail.slice(0, 2000));
    if (options.startedAt) patch.push('startedAt', options.startedAt);
    if (options.expiresAt) patch.push('expiresAt', options.expiresAt);
    if (options.hibernationLayer !== undefined) patch.push('hibernationLayer', options.hibernationLayer);
    const endedMs = this.now();
    if (terminal) patch.push('endedAt', new Date(endedMs).toISOString());
    const result = (await TRANSITION.run(
      this.redis,
      [keys.sandbox(id), keys.unsettled, keys.burstFellBack, keys.burstFellBackFailed, keys.layerRefs],
      [to, origins.join(','), terminal ? '1' : '0', 'rb:tenant:', 'rb:node:', options.node ?? '', ...patch],
    )) as string[];
    if (result[0] === 'missing') return { kind: 'missing' };
    if (result[0] === 'refused') return { kind: 'refused', current: result[1] as SandboxState };
    if (terminal) await this.endedPipeline(id, endedMs, result[2] ?? '', result[3] ?? '').exec();
    return { kind: 'ok', from: result[1] as SandboxState };
  }

  /**
   * A terminal record's expiry and, for a sandbox that ran, its residence (running to
   * ended) in the console's signals: one round trip, once per sandbox, never per second.
   * Sandboxes taken from a warm pool count apart (their time includes waiting ready).
   */
  private endedPipeline(id: string, endedMs: number, startedAt: string, pool: string) {
    const pipeline = this.redis.pipeline().expire(keys.sandbox(id), TERMINAL_RECORD_TTL_SEC);
    const startedMs = Date.parse(startedAt);
    if (Number.isFinite(startedMs)) SignalStore.addTo(pipeline, endedMs, observationFields(pool ? 'poolres' : 'res', endedMs - startedMs));
    return pipeline;
  }

  /** Replaces the stage policy (network, hidden paths) in a sandbox's spec. */
  /**
   * Changes part of a sandbox's spec atomically (a compare-and-set over the spec read, so
   * concurrent patches never lose one another). With `states`, only while the sandbox is
   * in one of them; otherwise undefined and nothing changed.
   */
  async patchSpec(id: string, patch: Partial<Pick<CreateSandboxRequest, 'network' | 'hiddenPaths'>>, states: readonly SandboxState[] = []): Promise<Sandbox | undefined> {
    for (;;) {
      const current = await this.get(id);
      if (!current) throw new RollboxError('not_found', `sandbox ${id} not found`);
      // The compare is over the stored text; what was parsed from it is current.spec.
      const specRead = (await this.redis.hget(keys.sandbox(id), 'spec')) ?? '';
      const spec = CreateSandboxRequest.parse({ ...current.spec, ...patch });
      const result = await SET_SPEC.run(this.redis, [keys.sandbox(id)], [specRead, JSON.stringify(spec), ...states]);
      if (result === 'ok') return { ...current, spec };
      if (result === 'state') return undefined;
    }
  }

  /**
   * Moves a pending or hibernated sandbox to another node; with `fromCreating`, also one
   * still creating on `fromNode` (a node lost before the sandbox ran). False when it may not move.
   */
  async reassign(id: string, fromNode: string | undefined, toNode: string, options: { fromCreating?: boolean } = {}): Promise<boolean> {
    const moved = await REASSIGN.run(this.redis, [keys.sandbox(id), fromNode ? keys.nodeSandboxes(fromNode) : 'rb:none', keys.nodeSandboxes(toNode)], [id, toNode, options.fromCreating ? '1' : '0', fromNode ?? '']);
    return moved === 1;
  }

  /**
   * Frees an Idempotency-Key whose sandbox never started (refused everywhere), so the
   * client's retry with the same key can try again instead of replaying the failure.
   */
  async releaseIdempotencyKey(tenant: string, idempotencyKey: string | undefined): Promise<void> {
    if (idempotencyKey) await this.redis.del(keys.idempotency(tenant, idempotencyKey));
  }

  /** A live sandbox's new end of life; false when it has ended (or is gone). */
  async setExpiresAt(id: string, expiresAt: string): Promise<boolean> {
    return (await SET_EXPIRES_AT.run(this.redis, [keys.sandbox(id)], [expiresAt])) === 1;
  }

  async addOomKills(id: string, count: number): Promise<void> {
    if (count > 0) await this.redis.hincrby(keys.sandbox(id), 'oomKills', count);
  }

  async list(tenant: string, query: ListSandboxesQuery): Promise<Sandbox[]> {
    const ids = await this.redis.zrevrange(keys.tenantAll(tenant), 0, 4999);
    const [labelKey, labelValue] = query.label ? splitLabel(query.label) : [];
    const out: Sandbox[] = [];
    const stale: string[] = [];
    for (let i = 0; i < ids.length && out.length < query.limit; i += 200) {
      const batch = ids.slice(i, i + 200);
      const pipeline = this.redis.pipeline();
      for (const id of batch) pipeline.hgetall(keys.sandbox(id));
      const rows = (await pipeline.exec()) ?? [];
      rows.forEach(([, hash], j) => {
        const sandbox = fromHash((hash ?? {}) as Record<string, string>);
        if (!sandbox) return void stale.push(batch[j]!);
        if (query.state && sandbox.state !== query.state) return;
        if (query.job && sandbox.spec.job !== query.job) return;
        if (labelKey !== undefined && sandbox.spec.labels[labelKey] !== labelValue) return;
        if (out.length < query.limit) out.push(sandbox);
      });
    }
    // Records of long-ended sandboxes expire; drop their ids from the tenant index.
    if (stale.length) await this.redis.zrem(keys.tenantAll(tenant), ...stale);
    return out;
  }

  /** A hibernated sandbox runs on no node, so its TTL is watched here (see `hibernatedPastTtl`). */
  async watchHibernatedTtl(id: string, expiresAtMs: number): Promise<void> {
    await this.redis.zadd(keys.hibernatedExpiry, expiresAtMs, id);
  }

  /** Sandboxes whose TTL ended while hibernated (or that left hibernation since: the caller's transition decides). */
  async hibernatedPastTtl(nowMs: number): Promise<string[]> {
    return this.redis.zrangebyscore(keys.hibernatedExpiry, 0, nowMs, 'LIMIT', 0, 500);
  }

  async unwatchHibernatedTtl(ids: readonly string[]): Promise<void> {
    if (ids.length) await this.redis.zrem(keys.hibernatedExpiry, ...ids);
  }

  /** Current states of many sandboxes in one round trip (undefined: record gone). */
  async states(ids: readonly string[]): Promise<(SandboxState | undefined)[]> {
    if (ids.length === 0) return [];
    const pipeline = this.redis.pipeline();
    for (const id of ids) pipeline.hget(keys.sandbox(id), 'state');
    const rows = (await pipeline.exec()) ?? [];
    return rows.map(([, state]) => (state ?? undefined) as SandboxState | undefined);
  }

  async sandboxesOfNode(nodeId: string): Promise<string[]> {
    return this.redis.smembers(keys.nodeSandboxes(nodeId));
  }

  /**
   * Layers some live sandbox refers to (its layers, its hibernation layer): one read of the
   * counts the sandbox scripts keep, whatever the number of sandboxes. The first call on a
   * cluster whose sandboxes predate the counts counts those once (a scan of the tenants'
   * live sets, one script per sandbox), then never again.
   */
  async layersInUse(): Promise<string[]> {
    if (!(await this.redis.exists(keys.layerRefsComplete))) {
      let cursor = '0';
      do {
        const [next, sets] = await this.redis.scan(cursor, 'MATCH', keys.tenantLive('*'), 'COUNT', 1000);
        for (const set of sets) for (const id of await this.redis.smembers(set)) await COUNT_LAYER_REFS.run(this.redis, [keys.sandbox(id), keys.layerRefs], []);
        cursor = next;
      } while (cursor !== '0');
      await this.redis.set(keys.layerRefsComplete, String(this.now()));
    }
    const counts = await this.redis.hgetall(keys.layerRefs);
    return Object.keys(counts).filter((digest) => Number(counts[digest]) > 0);
  }

  /** A node's sandboxes and, of those, the ones being deleted (`stopping`): two calls whatever their number. */
  async nodeView(nodeId: string): Promise<{ live: Set<string>; stopping: Set<string> }> {
    const [live, stopping] = await Promise.all([this.redis.smembers(keys.nodeSandboxes(nodeId)), this.redis.smembers(keys.nodeStopping(nodeId))]);
    return { live: new Set(live), stopping: new Set(stopping) };
  }

  /** Sandboxes that should have settled (left pending/creating) before `nowMs`. */
  async unsettledBefore(nowMs: number): Promise<string[]> {
    return this.redis.zrangebyscore(keys.unsettled, 0, nowMs, 'LIMIT', 0, 500);
  }
}

function splitLabel(label: string): [string, string] {
  const at = label.indexOf('=');
  if (at <= 0) throw new RollboxError('invalid_request', 'label filter must be key=value');
  return [label.slice(0, at), label.slice(at + 1)];
}
