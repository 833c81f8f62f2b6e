import { newId, reservationOf, type NodePoolStatus, type PoolRecord } from '../api/index.ts';
import type { PoolRegistry } from '../registry/index.ts';
import { decideAdmission } from './admission.ts';
import type { HostContext } from './host-context.ts';

/** A ready sandbox off its list with no sandbox record after this long was lost by its claimer (a gateway died mid-create). */
const ORPHAN_AFTER_MS = 30_000;
/**
 * The pool definitions are read again this often, not at every tick: each read is a Redis
 * call on every host whether or not any pool exists (at 500 hosts every 500 ms it was the
 * largest share of an idle cluster's calls, 1,000 a second). A new, changed or deleted pool
 * is followed within this; refills go on at every tick.
 */
const DEFINITIONS_REREAD_MS = 2000;

type PoolRef = { name: string; version: string };

/**
 * Warm pools, worker side: this host keeps `size` ready sandboxes of every pool, made in
 * advance (running the init, no tenant, no network) and offered on the host's ready list
 * in Redis, where a gateway's create takes one (create-handler.ts then binds it). Refill
 * is paced (`poolRefillConcurrency` at once) and starts runc under SCHED_IDLE, so it never
 * slows running commands; pool sandboxes count against the host's capacity like any other.
 * A pool that is deleted or changed has its ready sandboxes withdrawn and destroyed.
 */
export class PoolKeeper {
  private definitions: PoolRecord[] = [];
  private definitionsReadAtMs = -Infinity;
  /** Ready sandboxes no longer on their list, by when that was first seen. */
  private offList = new Map<string, number>();
  private starts = new Set<Promise<void>>();
  private stopped = false;
  /** One tick at a time: a slow one (many discards) is not overlapped by the next. */
  private ticking = false;

  constructor(
    private readonly ctx: HostContext,
    private readonly pools: PoolRegistry,
    private readonly refillConcurrency: number,
  ) {}

  /**
   * Worker start, before reconcile: the ready sandboxes on this host's lists of current
   * pool versions, to adopt. Lists of pools that are gone or changed are dropped (their
   * sandboxes are then removed by reconcile, as they are kept by nobody).
   */
  async toAdopt(): Promise<Map<string, PoolRef>> {
    this.definitions = await this.keptHere();
    const keep = new Map<string, PoolRef>();
    for (const [key, list] of await this.pools.readyListsOf(this.ctx.nodeId)) {
      if (!this.definitions.some((p) => p.name === list.pool && p.version === list.version)) {
        await this.pools.dropList(list.pool, key);
        continue;
      }
      for (const id of list.ids) keep.set(id, { name: list.pool, version: list.version });
    }
    return keep;
  }

  /** After reconcile: adopted ones are this host's again; those that did not survive come off their lists. */
  async adopted(candidates: ReadonlyMap<string, PoolRef>, adopted: ReadonlySet<string>): Promise<void> {
    for (const [id, ref] of candidates) {
      const def = this.definitions.find((p) => p.name === ref.name);
      if (adopted.has(id) && def) this.ctx.local.set({ id, ...reservationOf({ ...def.resources, diskMiB: def.diskMiB }), expiresAtMs: Infinity, starting: false, pool: ref });
      else await this.pools.withdraw(ref, this.ctx.nodeId, id);
    }
  }

  /** The pools this host keeps: those of its host pool. */
  private async keptHere(): Promise<PoolRecord[]> {
    return (await this.pools.list()).filter((p) => p.hostPool === this.ctx.deps.config.pool);
  }

  /** What the heartbeat says of each pool. */
  status(): Record<string, NodePoolStatus> {
    const out: Record<string, NodePoolStatus> = {};
    for (const def of this.definitions) {
      const mine = this.ctx.local.pooled().filter((s) => s.pool.name === def.name && s.pool.version === def.version);
      out[def.name] = { version: def.version, ready: mine.filter((s) => !s.starting).length, starting: mine.filter((s) => s.starting).length };
    }
    return out;
  }

  /** Every second or so: follow the definitions, drop what is stale or orphaned, refill. */
  async tick(): Promise<void> {
    if (this.stopped || this.ticking) return;
    this.ticking = true;
    try {
      await this.followDefinitions();
    } finally {
      this.ticking = false;
    }
  }

  private async followDefinitions(): Promise<void> {
    const nowMs = this.ctx.now();
    if (nowMs - this.definitionsReadAtMs >= DEFINITIONS_REREAD_MS) {
      this.definitions = await this.keptHere();
      this.definitionsReadAtMs = nowMs;
    }
    for (const s of this.ctx.local.pooled()) {
      if (s.starting || this.definitions.some((p) => p.name === s.pool.name && p.version === s.pool.version)) continue;
      // Of a deleted or changed pool. Claimed meanwhile (a record exists): its create binds it.
      if ((await this.pools.withdraw(s.pool, this.ctx.nodeId, s.id)) || !(await this.ctx.deps.registry.get(s.id))) await this.discard(s.id);
    }
    await this.shrink();
    await this.collectOrphans();
    this.refill();
  }

  /**
   * A ready sandbox whose init died (killed from the host, OOM) must not be handed out
   * (the host calls this when its init's channel closes, and from its audit).
   */
  async dropIfDead(id: string): Promise<void> {
    const s = this.ctx.local.get(id);
    if (!s?.pool || s.starting || (await this.ctx.deps.runtime.isRunning(id))) return;
    // Claimed meanwhile: its create finds it dead, destroys it and starts cold (create-handler.ts).
    if (await this.pools.withdraw(s.pool, this.ctx.nodeId, id)) await this.discard(id);
  }

  /**
   * Sandboxes a gateway took off the list but never recorded (it died between the two):
   * nobody will claim them. A claimed one has a record and is bound by its create.
   */
  private async collectOrphans(): Promise<void> {
    const now = this.ctx.now();
    const seen = new Set<string>();
    for (const def of this.definitions) {
      const onList = new Set(await this.pools.ready(def, this.ctx.nodeId));
      for (const s of this.ctx.local.pooled()) {
        if (s.starting || s.pool.name !== def.name || s.pool.version !== def.version || onList.has(s.id)) continue;
        seen.add(s.id);
        const since = this.offList.get(s.id) ?? now;
        this.offList.set(s.id, since);
        if (now - since >= ORPHAN_AFTER_MS && !(await this.ctx.deps.registry.get(s.id))) await this.discard(s.id);
      }
    }
    for (const id of this.offList.keys()) if (!seen.has(id)) this.offList.delete(id);
  }

  /** Releases what a pool holds past its size (it was made smaller). */
  private async shrink(): Promise<void> {
    for (const def of this.definitions) {
      const ready = this.ctx.local.pooled().filter((s) => !s.starting && s.pool.name === def.name && s.pool.version === def.version);
      for (const s of ready.slice(def.size)) if (await this.pools.withdraw(s.pool, this.ctx.nodeId, s.id)) await this.discard(s.id);
    }
  }

  /** Starts ready sandboxes where pools are short, as capacity and the pacing allow. */
  private refill(): void {
    for (const def of this.definitions) {
      const have = this.ctx.local.pooled().filter((s) => s.pool.name === def.name && s.pool.version === def.version).length;
      for (let i = have; i < def.size && this.starts.size < this.refillConcurrency; i++) {
        if (!this.admits(def)) return;
        const start = this.startOne(def).finally(() => this.starts.delete(start));
        this.starts.add(start);
      }
    }
  }

  private admits(def: PoolRecord): boolean {
    return decideAdmission(this.ctx.admissionState(), reservationOf({ ...def.resources, diskMiB: def.diskMiB })).admit;
  }

  private async startOne(def: PoolRecord): Promise<void> {
    const { ctx } = this;
    const id = newId('sbx');
    const ref = { name: def.name, version: def.version };
    ctx.local.set({ id, ...reservationOf({ ...def.resources, diskMiB: def.diskMiB }), expiresAtMs: Infinity, starting: true, pool: ref });
    try {
      const layerImages = await Promise.all(
        def.layerDigests.map(async (digest) => {
          const files = await ctx.deps.layerFiles(digest);
          if (!files) throw new Error(`layer ${digest} is not available on this host`);
          return files;
        }),
      );
      await ctx.deps.runtime.create({ sandboxId: id, layerImages, resources: { ...def.resources, diskMiB: def.diskMiB }, class: def.class, env: {}, workdir: '/', hiddenPaths: [], lowPriority: true });
      const local = ctx.local.get(id);
      if (!local || this.stopped) throw new Error('worker host stopping');
      local.starting = false;
      if (!(await this.pools.offer(ref, ctx.nodeId, id))) await this.discard(id); // the pool changed meanwhile
    } catch (err) {
      ctx.log.warn({ err, pool: def.name }, 'a warm-pool sandbox failed to start');
      await this.discard(id);
    }
  }

  private async discard(id: string): Promise<void> {
    this.offList.delete(id);
    await this.ctx.removeLocal(id);
  }

  /**
   * Stops refilling. With `destroy`, ready sandboxes come off their lists and are
   * destroyed; without, they stay offered for the next start to adopt.
   */
  async stop(options: { destroy: boolean }): Promise<void> {
    this.stopped = true;
    await Promise.all(this.starts);
    if (!options.destroy) return;
    for (const s of this.ctx.local.pooled()) {
      await this.pools.withdraw(s.pool, this.ctx.nodeId, s.id);
      await this.discard(s.id);
    }
  }
}
