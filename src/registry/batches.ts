import type { Redis } from 'ioredis';
import { Batch, BatchCounts, BatchOptions, BatchResultLine, RollboxError, type BatchTask, type BatchState, type BatchTaskStatus, type TaskStatus } from '../api/index.ts';
import { LuaScript } from '../redis/index.ts';
import { keys } from './keys.ts';

const SCRIPT = new LuaScript(import.meta.dirname, 'batch');
const COUNTS = ['total', 'queued', 'running', 'succeeded', 'failed', 'timeout', 'infra_error', 'cancelled'] as const;
const STATES: readonly BatchState[] = ['validating', 'in_progress', 'finalizing', 'completed', 'cancelling', 'cancelled', 'failed', 'expired'];

/** What the scheduler needs of an active batch, read in one round trip for all of them. */
export interface BatchLoad {
  id: string;
  tenant: string;
  state: BatchState;
  queued: number;
  running: number;
  createdAtMs: number;
  expiresAtMs: number;
  options: BatchOptions;
}

export type ResultLineInput = Omit<BatchResultLine, 'cursor' | 'endedAt'>;

/** The sandboxes of a task's latest attempt: its task sandbox and, for a hosted rollout, its agent's. */
export interface AttemptSandboxes {
  sandboxId: string;
  attempt: number;
  agentSandboxId?: string;
}

/**
 * Batches in Redis: the batch hash (state, options, counts, a timestamp per state), its
 * tasks' specs, the set of those running, attempts, terminal statuses and result stream.
 * Where a task waits and who runs it is BullMQ's (a queue per batch, see
 * src/gateway/batches/jobs.ts); every change of a task's count or result here is one
 * script (lua/batch.lua), so a task ends exactly once and the batch ends when its last task does.
 */
export class BatchStore {
  constructor(
    private readonly redis: Redis,
    private readonly now: () => number = Date.now,
  ) {}

  private run(id: string, op: string, ...args: (string | number)[]): Promise<unknown> {
    const k = [keys.batch(id), keys.batchSpecs(id), keys.batchRunning(id), keys.batchAttempts(id), keys.batchDone(id), keys.batchResults(id)];
    const nowMs = this.now();
    return SCRIPT.run(this.redis, k, [op, id, nowMs, new Date(nowMs).toISOString(), ...args]);
  }

  /** A new batch, `validating`; listed as active (the runners' `loads`) until its queue is removed after it ends. */
  async create(id: string, tenant: string, options: BatchOptions): Promise<void> {
    const nowMs = this.now();
    const at = new Date(nowMs).toISOString();
    await this.redis
      .multi()
      .hset(keys.batch(id), {
        id,
        tenant,
        state: 'validating',
        'ts:validating': at,
        options: JSON.stringify(options),
        maxConcurrency: options.maxConcurrency,
        createdAtMs: nowMs,
        expiresAtMs: nowMs + options.completionWindowSeconds * 1000,
        ...Object.fromEntries(COUNTS.map((c) => [`n:${c}`, 0])),
      })
      .exec();
    // The tenant's listing and the runners' set are other cluster slots.
    await Promise.all([this.redis.zadd(keys.tenantBatches(tenant), nowMs, id), this.redis.sadd(keys.activeBatches, id)]);
  }

  /**
   * Claims the tasks' customIds in a validating batch (HSETNX each, so two chunks or two
   * submitters can never both claim one); answers the first customId already in it, if any
   * (the caller then fails the batch, so nothing of it runs). The caller adds their jobs after.
   */
  async addTasks(id: string, tasks: readonly BatchTask[]): Promise<string | undefined> {
    const specs = keys.batchSpecs(id);
    const setnx = this.redis.pipeline();
    for (const t of tasks) setnx.hsetnx(specs, t.customId, '1');
    const fresh = (await setnx.exec())!.map(([, r]) => r === 1);
    const duplicate = tasks.find((_, i) => !fresh[i]);
    if (duplicate) return duplicate.customId;
    await this.redis.multi().hincrby(keys.batch(id), 'n:total', tasks.length).hincrby(keys.batch(id), 'n:queued', tasks.length).exec();
    return undefined;
  }

  /** validating -> in_progress: its tasks may be fetched from now on. */
  async start(id: string): Promise<boolean> {
    return (await this.run(id, 'start')) === 1;
  }

  /** A batch whose input was refused: `failed`, nothing of it runs (its queue is removed by the caller). */
  async fail(id: string, error: { code: string; message: string }): Promise<void> {
    const at = new Date(this.now()).toISOString();
    await this.redis.hset(keys.batch(id), { state: 'failed', 'ts:failed': at, error: JSON.stringify(error), 'n:queued': 0 });
  }

  /** No longer active: its queue is gone, no runner looks at it again. */
  async forget(id: string): Promise<void> {
    await this.redis.srem(keys.activeBatches, id);
  }

  async get(id: string): Promise<Batch | undefined> {
    const h = await this.redis.hgetall(keys.batch(id));
    if (!h['id']) return undefined;
    const counts = Object.fromEntries(COUNTS.map((c) => [c, Number(h[`n:${c}`] ?? 0)])) as BatchCounts;
    const timestamps = Object.fromEntries(STATES.filter((s) => h[`ts:${s}`]).map((s) => [s, h[`ts:${s}`]!]));
    return Batch.parse({
      id,
      tenant: h['tenant'],
      state: h['state'],
      options: JSON.parse(h['options']!),
      counts,
      timestamps,
      createdAt: new Date(Number(h['createdAtMs'])).toISOString(),
      expiresAt: new Date(Number(h['expiresAtMs'])).toISOString(),
      ...(h['error'] ? { error: JSON.parse(h['error']) } : {}),
    });
  }

  /** The batch if it is the tenant's; another tenant's batch is not found either. */
  async getOwned(id: string, tenant: string): Promise<Batch> {
    const batch = /^batch_[a-z0-9]+$/.test(id) ? await this.get(id) : undefined;
    if (!batch || batch.tenant !== tenant) throw new RollboxError('not_found', `no batch ${id}`);
    return batch;
  }

  async list(tenant: string, limit: number): Promise<Batch[]> {
    const ids = await this.redis.zrevrange(keys.tenantBatches(tenant), 0, limit - 1);
    return (await Promise.all(ids.map((id) => this.get(id)))).filter((b): b is Batch => b !== undefined);
  }

  async loads(): Promise<BatchLoad[]> {
    const ids = await this.redis.smembers(keys.activeBatches);
    if (ids.length === 0) return [];
    // One read per batch (each its own cluster slot), sent together by auto-pipelining.
    const rows = await Promise.all(ids.map((id) => this.redis.hmget(keys.batch(id), 'tenant', 'state', 'n:queued', 'n:running', 'createdAtMs', 'expiresAtMs', 'options')));
    return ids.flatMap((id, i) => {
      const [tenant, state, queued, running, created, expires, options] = rows[i]!;
      if (!tenant || !state || !options) return [];
      const parsed = BatchOptions.parse(JSON.parse(options));
      return [{ id, tenant, state: state as BatchState, queued: Number(queued), running: Number(running), createdAtMs: Number(created), expiresAtMs: Number(expires), options: parsed }];
    });
  }

  /**
   * The task's job was fetched: it counts as running. Answers its attempt number (stalls,
   * infra failures and this one; what no room gave back is not counted), or undefined when
   * it has its result already.
   */
  async begin(id: string, customId: string): Promise<number | undefined> {
    const attempt = Number(await this.run(id, 'begin', customId));
    return attempt > 0 ? attempt : undefined;
  }

  /** Records the task's one result; `cursor` undefined when it had one already (another runner's, or a cancel). */
  async finish(id: string, line: ResultLineInput): Promise<{ cursor: string | undefined; batchEnded: boolean }> {
    const full = { ...line, endedAt: new Date(this.now()).toISOString() };
    const [cursor, ended] = (await this.run(id, 'finish', line.customId, line.status, JSON.stringify(full))) as [string | null, number];
    return { cursor: typeof cursor === 'string' ? cursor : undefined, batchEnded: ended === 1 };
  }

  /**
   * The task stopped running here and its job waits again: charged (an infra failure, a
   * stalled job) or not (no room yet, the gateway stopping). Ends it cancelled when its
   * batch is being cancelled. False when it was not running (ended, or released already).
   */
  async release(id: string, customId: string, charge: boolean): Promise<{ released: boolean; batchEnded: boolean }> {
    const [released, ended] = (await this.run(id, 'release', customId, charge ? '1' : '0')) as [number, number];
    return { released: released === 1, batchEnded: ended === 1 };
  }

  async cancel(id: string, endState: 'cancelled' | 'expired', reason: string): Promise<BatchState> {
    return (await this.run(id, 'cancel', endState, reason)) as BatchState;
  }

  /** The sandbox of the task's latest attempt (deleted before the next attempt starts). */
  async attemptSandbox(id: string, customId: string): Promise<AttemptSandboxes | undefined> {
    const raw = await this.redis.hget(keys.batchSandboxes(id), customId);
    return raw ? (JSON.parse(raw) as AttemptSandboxes) : undefined;
  }

  async recordAttemptSandbox(id: string, customId: string, attempt: AttemptSandboxes): Promise<void> {
    await this.redis.hset(keys.batchSandboxes(id), customId, JSON.stringify(attempt));
  }

  async state(id: string): Promise<BatchState | undefined> {
    return ((await this.redis.hget(keys.batch(id), 'state')) ?? undefined) as BatchState | undefined;
  }

  /** Result lines after `after` (a cursor; from the start without one), oldest first. */
  async results(id: string, after: string | undefined, limit: number): Promise<BatchResultLine[]> {
    const entries = await this.redis.xrange(keys.batchResults(id), after ? `(${after}` : '-', '+', 'COUNT', limit);
    return entries.map(([cursor, fields]) => BatchResultLine.parse({ ...JSON.parse(fields[1]!), cursor }));
  }

  /** Done (with its status), running, or queued (its position is the queue's: the caller adds it). */
  async taskStatus(id: string, customId: string): Promise<BatchTaskStatus> {
    const [spec, status, attempts, running] = await Promise.all([
      this.redis.hexists(keys.batchSpecs(id), customId),
      this.redis.hget(keys.batchDone(id), customId),
      this.redis.hget(keys.batchAttempts(id), customId),
      this.redis.sismember(keys.batchRunning(id), customId),
    ]);
    if (!spec) throw new RollboxError('not_found', `no task ${customId} in batch ${id}`);
    const base = { customId, attempts: Number(attempts ?? 0) };
    if (status) return { ...base, state: 'done', status: status as TaskStatus };
    return { ...base, state: running ? 'running' : 'queued' };
  }
}
