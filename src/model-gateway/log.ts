import type { Redis } from 'ioredis';
import { ModelLimits, RollboxError, type ModelCallList, type ModelCallRecord, type ModelFigures, type ModelUsage } from '../api/index.ts';
import { modelKeys } from './keys.ts';

/**
 * A rollout's recorded model calls, in the order they ended (`seq`), read with a cursor:
 * `list(rolloutId, {after})` gives the calls past `after` and the `nextAfter` to pass next
 * time. A call is listed once it ended (its record is written with its answer's end).
 */
export class ModelCallLog {
  constructor(private readonly redis: Redis) {}

  async list(rolloutId: string, options: { after?: number; limit?: number } = {}): Promise<ModelCallList> {
    const after = options.after ?? 0;
    const limit = Math.min(Math.max(options.limit ?? 100, 1), 1000);
    const ids = await this.redis.zrangebyscore(modelKeys.log(rolloutId), `(${after}`, '+inf', 'LIMIT', 0, limit);
    if (ids.length === 0) return { calls: [], nextAfter: after };
    const rows = await this.redis.hmget(modelKeys.records(rolloutId), ...ids);
    const calls = rows.filter((row): row is string => row !== null).map((row) => JSON.parse(row) as ModelCallRecord);
    return { calls, nextAfter: calls.at(-1)?.seq ?? after };
  }

  async get(rolloutId: string, callId: string): Promise<ModelCallRecord | null> {
    const row = await this.redis.hget(modelKeys.records(rolloutId), callId);
    return row ? (JSON.parse(row) as ModelCallRecord) : null;
  }
}

/**
 * A rollout's limits on its model calls, set when the rollout starts: past them a call is
 * refused (`model_limit_exceeded`, in the SDK's error shape) and `usage().hit` says
 * which limit ended it; past `deadlineMs` no call is started or held.
 */
export class RolloutLimits {
  constructor(
    private readonly redis: Redis,
    private readonly ttlSeconds: number,
  ) {}

  async set(rolloutId: string, limits: ModelLimits): Promise<void> {
    const parsed = ModelLimits.safeParse(limits);
    if (!parsed.success) throw new RollboxError('invalid_request', `model limits: ${parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`);
    const key = modelKeys.usage(rolloutId);
    const multi = this.redis.multi().hdel(key, 'maxModelCalls', 'maxTokens', 'deadlineMs');
    const fields = Object.entries(parsed.data).filter(([, v]) => v !== undefined);
    if (fields.length) multi.hset(key, Object.fromEntries(fields.map(([k, v]) => [k, String(v)])));
    await multi.expire(key, this.ttlSeconds).exec();
  }

  async usage(rolloutId: string): Promise<ModelUsage> {
    const row = await this.redis.hgetall(modelKeys.usage(rolloutId));
    const num = (field: string) => (row[field] === undefined ? undefined : Number(row[field]));
    const limits: ModelLimits = {};
    for (const field of ['maxModelCalls', 'maxTokens', 'deadlineMs'] as const) if (num(field) !== undefined) limits[field] = num(field);
    return { calls: num('calls') ?? 0, tokens: num('tokens') ?? 0, limits, ...(row.hit ? { hit: row.hit as ModelUsage['hit'] } : {}) };
  }

  /** The rollout's wall time, for holds (a held call fails past it). */
  async deadlineOf(rolloutId: string): Promise<number | undefined> {
    const value = await this.redis.hget(modelKeys.usage(rolloutId), 'deadlineMs');
    return value === null ? undefined : Number(value);
  }
}

const FIGURE_FIELDS = ['calls', 'failedCalls', 'upstreamMs', 'heldMs', 'tokens', 'retriesJoined', 'reissues'] as const;

/**
 * A job's model figures (ModelFigures), summed in Redis as its calls are recorded: the
 * console reads them per job. Each gateway adds what it recorded once a second (`flush`),
 * so a model call costs no Redis call for them.
 */
export class JobFigures {
  private pending = new Map<string, { tenant: string; job: string; add: Record<(typeof FIGURE_FIELDS)[number], number> }>();

  constructor(private readonly redis: Redis) {}

  add(tenant: string, job: string, record: ModelCallRecord, reissues: number): void {
    const ref = `${tenant}/${job}`;
    const entry = this.pending.get(ref) ?? { tenant, job, add: Object.fromEntries(FIGURE_FIELDS.map((f) => [f, 0])) as Record<(typeof FIGURE_FIELDS)[number], number> };
    const add = entry.add;
    add.calls += 1;
    add.failedCalls += record.outcome === 'ok' ? 0 : 1;
    add.upstreamMs += Math.round(record.upstreamMs);
    add.heldMs += Math.round(record.heldMs);
    add.tokens += record.usage?.completionTokens ?? 0;
    add.retriesJoined += record.retriesJoined;
    add.reissues += reissues;
    this.pending.set(ref, entry);
  }

  /** Writes what was added since the last flush. */
  async flush(): Promise<void> {
    const batch = this.pending;
    if (batch.size === 0) return;
    this.pending = new Map();
    await Promise.all(
      [...batch.values()].map(({ tenant, job, add }) => {
        const multi = this.redis.multi();
        for (const field of FIGURE_FIELDS) if (add[field]) multi.hincrby(modelKeys.figures(tenant, job), field, add[field]);
        return multi.exec();
      }),
    );
  }

  async read(tenant: string, job: string): Promise<ModelFigures> {
    const row = await this.redis.hgetall(modelKeys.figures(tenant, job));
    return Object.fromEntries(FIGURE_FIELDS.map((field) => [field, Number(row[field] ?? 0)])) as ModelFigures;
  }
}
