import type { Redis } from 'ioredis';
import { Batch, BatchCounts, BatchOptions, BatchResultLine, BatchTask, RollboxError, type BatchState, type BatchTaskStatus, type TaskStatus } from '../api/index.ts';
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

/**
 * Batches in Redis: the batch hash (state, options, counts, a timestamp per state), its
 * tasks' specs, queue, leases, attempts, terminal statuses and result stream. Every change
 * of a task's place is one script (lua/batch.lua), so a task is claimed by one runner at a
 * time, ends exactly once, and the batch ends when its last task does.
 */
export class BatchStore {
  constructor(
    private readonly redis: Redis,
    private readonly now: () => number = Date.now,
  ) {}

  private run(id: string, op: string, ...args: (string | number)[]): Promise<unknown> {
    const k = [keys.batch(id), keys.batchQueue(id), keys.batchLeases(id), keys.batchAttempts(id), keys.batchDone(id), keys.batchResults(id), keys.activeBatches];
    const nowMs = this.now();
    return SCRIPT.run(this.redis, k, [op, id, nowMs, new Date(nowMs).toISOString(), ...args]);
  }

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
      .zadd(keys.tenantBatches(tenant), nowMs, id)
      .exec();
  }

  /** Adds tasks to a validating batch; answers the first customId already in it, if any (nothing of that chunk is queued then). */
  async addTasks(id: string, tasks: readonly BatchTask[]): Promise<string | undefined> {
    const specs = keys.batchSpecs(id);
    const setnx = this.redis.pipeline();
    for (const t of tasks) setnx.hsetnx(specs, t.customId, JSON.stringify(t));
    const fresh = (await setnx.exec())!.map(([, r]) => r === 1);
    const duplicate = tasks.find((_, i) => !fresh[i]);
    if (duplicate) return duplicate.customId;
    await this.redis
      .multi()
      .rpush(keys.batchQueue(id), ...tasks.map((t) => t.customId))
      .hincrby(keys.batch(id), 'n:total', tasks.length)
      .hincrby(keys.batch(id), 'n:queued', tasks.length)
      .exec();
    return undefined;
  }

  /** validating -> in_progress: its tasks may be claimed from now on. */
  async start(id: string): Promise<boolean> {
    return (await this.run(id, 'start')) === 1;
  }

  /** A batch whose input was refused: `failed`, nothing of it runs. */
  async fail(id: string, error: { code: string; message: string }): Promise<void> {
    const at = new Date(this.now()).toISOString();
    await this.redis
      .multi()
      .hset(keys.batch(id), { state: 'failed', 'ts:failed': at, error: JSON.stringify(error), 'n:queued': 0 })
      .del(keys.batchQueue(id))
      .srem(keys.activeBatches, id)
      .exec();
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
    const p = this.redis.pipeline();
    for (const id of ids) p.hmget(keys.batch(id), 'tenant', 'state', 'n:queued', 'n:running', 'createdAtMs', 'expiresAtMs', 'options');
    const rows = (await p.exec())!;
    return ids.flatMap((id, i) => {
      const [tenant, state, queued, running, created, expires, options] = rows[i]![1] as (string | null)[];
      if (!tenant || !state || !options) return [];
      const parsed = BatchOptions.parse(JSON.parse(options));
      return [{ id, tenant, state: state as BatchState, queued: Number(queued), running: Number(running), createdAtMs: Number(created), expiresAtMs: Number(expires), options: parsed }];
    });
  }

  /** The next queued task of the batch, leased to the caller until `leaseUntilMs`; undefined when none may start. */
  async claim(id: string, leaseUntilMs: number): Promise<{ customId: string; attempt: number; task: BatchTask } | undefined> {
    const claimed = (await this.run(id, 'claim', leaseUntilMs)) as [string, number] | null;
    if (!claimed) return undefined;
    const raw = await this.redis.hget(keys.batchSpecs(id), claimed[0]);
    return { customId: claimed[0], attempt: Number(claimed[1]), task: BatchTask.parse(JSON.parse(raw!)) };
  }

  /** Records the task's one result; undefined when it had one already (another runner's, or a cancel). */
  async finish(id: string, line: ResultLineInput): Promise<string | undefined> {
    const full = { ...line, endedAt: new Date(this.now()).toISOString() };
    const cursor = await this.run(id, 'finish', line.customId, line.status, JSON.stringify(full));
    return typeof cursor === 'string' ? cursor : undefined;
  }

  /** Back to the head of the queue: charged (an infra failure) or not (backpressure: no room yet). */
  async requeue(id: string, customId: string, charge: boolean): Promise<boolean> {
    return (await this.run(id, 'requeue', customId, charge ? '1' : '0')) === 1;
  }

  async renew(id: string, customIds: readonly string[], leaseUntilMs: number): Promise<void> {
    if (customIds.length > 0) await this.run(id, 'renew', leaseUntilMs, ...customIds);
  }

  /** Queues again the tasks whose runner stopped renewing its lease. */
  async reclaim(id: string): Promise<number> {
    return Number(await this.run(id, 'reclaim'));
  }

  async cancel(id: string, endState: 'cancelled' | 'expired', reason: string): Promise<BatchState> {
    return (await this.run(id, 'cancel', endState, reason)) as BatchState;
  }

  /** The sandbox of the task's latest attempt (deleted before the next attempt starts). */
  async attemptSandbox(id: string, customId: string): Promise<{ sandboxId: string; attempt: number } | undefined> {
    const raw = await this.redis.hget(keys.batchSandboxes(id), customId);
    return raw ? (JSON.parse(raw) as { sandboxId: string; attempt: number }) : undefined;
  }

  async recordAttemptSandbox(id: string, customId: string, attempt: { sandboxId: string; attempt: number }): Promise<void> {
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

  async taskStatus(id: string, customId: string): Promise<BatchTaskStatus> {
    const [spec, status, attempts, leased] = await Promise.all([
      this.redis.hexists(keys.batchSpecs(id), customId),
      this.redis.hget(keys.batchDone(id), customId),
      this.redis.hget(keys.batchAttempts(id), customId),
      this.redis.zscore(keys.batchLeases(id), customId),
    ]);
    if (!spec) throw new RollboxError('not_found', `no task ${customId} in batch ${id}`);
    const base = { customId, attempts: Number(attempts ?? 0) };
    if (status) return { ...base, state: 'done', status: status as TaskStatus };
    if (leased !== null) return { ...base, state: 'running' };
    const position = await this.redis.lpos(keys.batchQueue(id), customId);
    return position === null ? { ...base, state: 'running' } : { ...base, state: 'queued', position };
  }
}
