// Longer than most: the sandbox record and every atomic change to it (admission, transitions,
// spec, expiry, layer refs), one Lua-backed store, so no caller writes the record another way.
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
} from '../api/index.ts';
import { keys } from './keys.ts';
import { fromHash, toFields } from './sandbox-record.ts';
import { LuaScript } from '../redis/index.ts';
import { SignalStore, observationFields } from './signals.ts';

// Each state change is one script (KEYS, ARGV and answers in its file's header).
const ADMIT_SANDBOX = new LuaScript(import.meta.dirname, 'admit-sandbox');
const RECORD_SANDBOX = new LuaScript(import.meta.dirname, 'record-sandbox');
const TRANSITION = new LuaScript(import.meta.dirname, 'transition-sandbox');
const REASSIGN = new LuaScript(import.meta.dirname, 'reassign-sandbox');
const SET_SPEC = new LuaScript(import.meta.dirname, 'set-sandbox-spec');
const SET_EXPIRES_AT = new LuaScript(import.meta.dirname, 'set-sandbox-expiry');
const SET_SWAPPED = new LuaScript(import.meta.dirname, 'set-sandbox-swapped');
const LAYER_REFS = new LuaScript(import.meta.dirname, 'layer-refs');
const SETTLE_FELL_BACK = new LuaScript(import.meta.dirname, 'settle-fell-back');

/** Idempotency keys are remembered this long. */
const IDEMPOTENCY_TTL_SEC = 24 * 3600;
/** Terminal records stay readable this long. */
const TERMINAL_RECORD_TTL_SEC = 24 * 3600;
/**
 * A sandbox admitted this long ago whose record is still missing was left half made by a
 * gateway that died between the two steps of `admit`: its quota entry and
 * Idempotency-Key are freed (the record follows the admission within milliseconds).
 */
const HALF_ADMITTED_AFTER_MS = 30_000;
/** A tenant at its quota has its live set checked against the records at most this often per gateway. */
const QUOTA_TRIM_INTERVAL_MS = 10_000;

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
  /** Hibernated whole (its image in the layer store); false clears it (woken). */
  hibernatedWhole?: boolean;
  /** Paged out while paused (pause mode `swap`); null clears it (resumed). */
  swapped?: Sandbox['swapped'] | null;
}

/** States from which `to` may be entered. */
function legalOrigins(to: SandboxState): SandboxState[] {
  return SandboxStateSchema.options.filter((from) => STATE_TRANSITIONS[from].includes(to));
}

/**
 * The sandbox registry in Redis: records, tenant quotas, idempotency keys and the
 * node -> sandboxes index. Shared by every gateway and worker host.
 *
 * Each step is one script on one entity's keys (one Redis Cluster slot). The indexes
 * beside the records (a tenant's live set, a node's sets, the unsettled sandboxes, the
 * layer references) are other slots, so they change in separate calls, ordered to keep
 * every index a superset of what the records say: an entry is added before the record
 * change that needs it and removed after the change that ends it. A process dying between
 * two calls leaves an extra entry, never a missing one; whoever acts on an entry reads the
 * record first (transitions check the state, the worker's audit the `stopping` entries,
 * the quota the live set when it would refuse), so an extra entry costs a read, not a
 * wrong decision. Layer references left over count a layer as used: it stays stored.
 */
export class SandboxRegistry {
  private readonly quotaTrimmedAtMs = new Map<string, number>();

  constructor(
    private readonly redis: Redis,
    private readonly now: () => number = Date.now,
  ) {}

  async admit(input: { record: Sandbox; maxLive: number; idempotencyKey?: string; requestHash: string; settleDeadlineMs: number }): Promise<AdmitOutcome> {
    const { record } = input;
    const idemKey = input.idempotencyKey ? keys.idempotency(record.tenant, input.idempotencyKey) : '';
    const admitTenant = async () =>
      (await ADMIT_SANDBOX.run(
        this.redis,
        [keys.tenantLive(record.tenant), keys.tenantAll(record.tenant), ...(idemKey ? [idemKey] : [])],
        [record.id, input.maxLive, Date.parse(record.createdAt), `${record.id}|${input.requestHash}`, IDEMPOTENCY_TTL_SEC],
      )) as string[];
    let result = await admitTenant();
    if (result[0] === 'quota' && (await this.trimTenantLive(record.tenant)) > 0) result = await admitTenant();
    if (result[0] === 'exists') {
      const { sandboxId, requestHash } = splitIdempotencyValue(result[1]);
      if (!(await this.halfAdmitted(record.tenant, sandboxId))) return { kind: 'exists', sandboxId, requestHash };
      await this.redis.del(idemKey);
      result = await admitTenant();
      if (result[0] === 'exists') return { kind: 'exists', ...splitIdempotencyValue(result[1]) };
    }
    if (result[0] === 'quota') return { kind: 'quota', liveCount: Number(result[1]) };
    // The indexes first (see the class comment), then the record.
    await Promise.all([
      record.node ? this.redis.sadd(keys.nodeSandboxes(record.node), record.id) : undefined,
      this.redis.zadd(keys.unsettled, input.settleDeadlineMs, record.id),
      this.refLayers(1, record.layerDigests),
    ]);
    await RECORD_SANDBOX.run(this.redis, [keys.sandbox(record.id)], toFields(record));
    return { kind: 'created' };
  }

  /** True when the sandbox an Idempotency-Key names was admitted long ago and never recorded (see HALF_ADMITTED_AFTER_MS). */
  private async halfAdmitted(tenant: string, sandboxId: string): Promise<boolean> {
    const [recorded, admittedAtMs] = await Promise.all([this.redis.exists(keys.sandbox(sandboxId)), this.redis.zscore(keys.tenantAll(tenant), sandboxId)]);
    return !recorded && this.now() - Number(admittedAtMs ?? 0) > HALF_ADMITTED_AFTER_MS;
  }

  /**
   * Drops from a tenant's live set what the records say has ended (or was never recorded):
   * run when the quota would refuse, at most every QUOTA_TRIM_INTERVAL_MS. Answers how many went.
   */
  private async trimTenantLive(tenant: string): Promise<number> {
    const nowMs = this.now();
    if (nowMs - (this.quotaTrimmedAtMs.get(tenant) ?? 0) < QUOTA_TRIM_INTERVAL_MS) return 0;
    this.quotaTrimmedAtMs.set(tenant, nowMs);
    const ids = await this.redis.smembers(keys.tenantLive(tenant));
    const states = await this.states(ids);
    const gone = await Promise.all(ids.map(async (id, i) => {
      const state = states[i];
      if (state) return isTerminal(state);
      return this.halfAdmitted(tenant, id);
    }));
    const ended = ids.filter((_, i) => gone[i]);
    if (ended.length) await this.redis.srem(keys.tenantLive(tenant), ...ended);
    return ended.length;
  }

  private async refLayers(by: 1 | -1, digests: readonly string[]): Promise<void> {
    if (digests.length) await LAYER_REFS.run(this.redis, [keys.layerRefs], [by, ...digests]);
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
    if (options.hibernatedWhole !== undefined) patch.push('hibernatedWhole', options.hibernatedWhole ? '1' : '');
    if (options.swapped !== undefined) patch.push('swapped', options.swapped ? JSON.stringify(options.swapped) : '');
    const endedMs = this.now();
    if (terminal) patch.push('endedAt', new Date(endedMs).toISOString());
    // Entries the new state needs, before the record (see the class comment).
    const hibernationAdded = options.hibernationLayer || undefined;
    const stoppingNode = to === 'stopping' ? (options.node ?? (await this.redis.hget(keys.sandbox(id), 'node')) ?? undefined) : undefined;
    await Promise.all([stoppingNode ? this.redis.sadd(keys.nodeStopping(stoppingNode), id) : undefined, this.refLayers(1, hibernationAdded ? [hibernationAdded] : [])]);
    const result = (await TRANSITION.run(this.redis, [keys.sandbox(id)], [to, origins.join(','), terminal ? '1' : '0', options.node ?? '', ...patch])) as string[];
    if (result[0] !== 'ok') {
      await Promise.all([stoppingNode && result[1] !== 'stopping' ? this.redis.srem(keys.nodeStopping(stoppingNode), id) : undefined, this.refLayers(-1, hibernationAdded ? [hibernationAdded] : [])]);
      return result[0] === 'missing' ? { kind: 'missing' } : { kind: 'refused', current: result[1] as SandboxState };
    }
    const [, from, startedAt = '', pool = '', tenant = '', node = '', uncounted = '[]', hibernationBefore = '', counted] = result;
    const unrefs = JSON.parse(uncounted) as string[];
    if (options.hibernationLayer !== undefined) {
      const changed = hibernationBefore !== options.hibernationLayer;
      if (counted === '1' && changed && hibernationBefore) unrefs.push(hibernationBefore);
      if (hibernationAdded && (counted !== '1' || !changed)) unrefs.push(hibernationAdded);
    }
    // Entries the old state needed, after the record.
    await Promise.all([
      to !== 'pending' && to !== 'creating' ? this.redis.zrem(keys.unsettled, id) : undefined,
      this.refLayers(-1, unrefs),
      ...(terminal
        ? [
            this.redis.srem(keys.tenantLive(tenant), id),
            node ? this.redis.srem(keys.nodeSandboxes(node), id) : undefined,
            node ? this.redis.srem(keys.nodeStopping(node), id) : undefined,
            SETTLE_FELL_BACK.run(this.redis, [keys.burstFellBack, keys.burstFellBackFailed], [id, to === 'failed' ? '1' : '0']),
            this.redis.expire(keys.sandbox(id), TERMINAL_RECORD_TTL_SEC),
            this.recordResidence(endedMs, startedAt, pool),
          ]
        : []),
    ]);
    return { kind: 'ok', from: from as SandboxState };
  }

  /**
   * An ended sandbox that ran: its residence (running to ended) in the console's signals,
   * once per sandbox, never per second. Sandboxes taken from a warm pool count apart
   * (their time includes waiting ready).
   */
  private async recordResidence(endedMs: number, startedAt: string, pool: string): Promise<void> {
    const startedMs = Date.parse(startedAt);
    if (!Number.isFinite(startedMs)) return;
    const pipeline = this.redis.pipeline();
    SignalStore.addTo(pipeline, endedMs, observationFields(pool ? 'poolres' : 'res', endedMs - startedMs));
    await pipeline.exec();
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
    // In the new node's set before the record moves, out of the old one's after.
    await this.redis.sadd(keys.nodeSandboxes(toNode), id);
    const moved = (await REASSIGN.run(this.redis, [keys.sandbox(id)], [toNode, options.fromCreating ? '1' : '0', fromNode ?? ''])) === 1;
    if (moved && fromNode && fromNode !== toNode) await this.redis.srem(keys.nodeSandboxes(fromNode), id);
    if (!moved && (await this.redis.hget(keys.sandbox(id), 'node')) !== toNode) await this.redis.srem(keys.nodeSandboxes(toNode), id);
    return moved;
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

  /** A sandbox paused on `node` had its memory paged out; false when it is not paused there. */
  setSwapped = async (id: string, node: string, swapped: NonNullable<Sandbox['swapped']>): Promise<boolean> => (await SET_SWAPPED.run(this.redis, [keys.sandbox(id)], [node, JSON.stringify(swapped)])) === 1;

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
      // Separate reads (each record is its own cluster slot), sent together by auto-pipelining.
      const rows = await Promise.all(batch.map((id) => this.redis.hgetall(keys.sandbox(id))));
      rows.forEach((hash, j) => {
        const sandbox = fromHash(hash);
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
    const rows = await Promise.all(ids.map((id) => this.redis.hget(keys.sandbox(id), 'state')));
    return rows.map((state) => (state ?? undefined) as SandboxState | undefined);
  }

  async sandboxesOfNode(nodeId: string): Promise<string[]> {
    return this.redis.smembers(keys.nodeSandboxes(nodeId));
  }

  /**
   * Layers some live sandbox refers to (its layers, its hibernation layer): one read of the
   * counts kept beside the sandbox records, whatever the number of sandboxes (sandboxes
   * recorded before the counts existed were counted by the key migration, src/registry/migrate).
   */
  async layersInUse(): Promise<string[]> {
    const counts = await this.redis.hgetall(keys.layerRefs);
    return Object.keys(counts).filter((digest) => Number(counts[digest]) > 0);
  }

  /** A node's sandboxes and, of those, the ones being deleted (`stopping`): two calls whatever their number. */
  async nodeView(nodeId: string): Promise<{ live: Set<string>; stopping: Set<string> }> {
    const [live, stopping] = await Promise.all([this.redis.smembers(keys.nodeSandboxes(nodeId)), this.redis.smembers(keys.nodeStopping(nodeId))]);
    // An entry added for a delete that was then refused (or whose gateway died before the
    // record changed) is no delete: only what the records say is stopping or ended counts.
    const states = await this.states(stopping);
    const spurious = stopping.filter((_, i) => states[i] !== undefined && states[i] !== 'stopping' && !isTerminal(states[i]!));
    if (spurious.length) await this.redis.srem(keys.nodeStopping(nodeId), ...spurious);
    return { live: new Set(live), stopping: new Set(stopping.filter((id) => !spurious.includes(id))) };
  }

  /** Sandboxes that should have settled (left pending/creating) before `nowMs`. */
  async unsettledBefore(nowMs: number): Promise<string[]> {
    return this.redis.zrangebyscore(keys.unsettled, 0, nowMs, 'LIMIT', 0, 500);
  }
}

function splitIdempotencyValue(value: string | undefined): { sandboxId: string; requestHash: string } {
  const [sandboxId = '', requestHash = ''] = (value ?? '').split('|');
  return { sandboxId, requestHash };
}

function splitLabel(label: string): [string, string] {
  const at = label.indexOf('=');
  if (at <= 0) throw new RollboxError('invalid_request', 'label filter must be key=value');
  return [label.slice(0, at), label.slice(at + 1)];
}
