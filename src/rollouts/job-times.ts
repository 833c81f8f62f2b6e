import type { Redis } from 'ioredis';
import { ROLLOUT_TIME_PARTS, RolloutEnd, type BatchResultLine, type JobRolloutTimes, type RolloutTimesMs } from '../api/index.ts';
import { modelKeys } from '../model-gateway/index.ts';

/** The jobs whose rollouts ended lately, scored by when the last one did (`JSON [tenant, job]`): what the console lists. */
const LATEST_JOBS_KEY = 'rb:rollout-times:jobs';
/** Jobs kept in that list (their counters stay; only the console's list forgets them). */
const LATEST_JOBS_KEPT = 1000;
const TIME_FIELDS = [...ROLLOUT_TIME_PARTS, 'total'] as const;

/** How a rollout ended, from its result line: one that did not succeed after hitting a model limit ended at the `limit`. */
export function rolloutEndOf(line: Pick<BatchResultLine, 'status' | 'rollout'>): RolloutEnd {
  return line.status !== 'succeeded' && line.rollout?.hit ? 'limit' : line.status;
}

/**
 * Each training job's ended rollouts by how they ended, and the sums of their times, in one
 * hash under the job's hash tag (beside its model figures): one MULTI of HINCRBYs per ended
 * rollout, however many gateways. A job is one label value in Prometheus too: a team runs
 * few jobs at once, so the series stay few.
 */
export class JobRolloutTimesStore {
  constructor(
    private readonly redis: Redis,
    private readonly now: () => number,
  ) {}

  async add(tenant: string, job: string, end: RolloutEnd, timesMs: RolloutTimesMs | undefined): Promise<void> {
    const key = modelKeys.rolloutTimes(tenant, job);
    const multi = this.redis.multi().hincrby(key, `ended:${end}`, 1);
    if (timesMs) {
      multi.hincrby(key, 'timed', 1);
      for (const field of TIME_FIELDS) if (timesMs[field]) multi.hincrby(key, `ms:${field}`, timesMs[field]);
    }
    await Promise.all([
      multi.exec(),
      this.redis
        .multi()
        .zadd(LATEST_JOBS_KEY, this.now(), JSON.stringify([tenant, job]))
        .zremrangebyrank(LATEST_JOBS_KEY, 0, -LATEST_JOBS_KEPT - 1)
        .exec(),
    ]);
  }

  async read(tenant: string, job: string): Promise<JobRolloutTimes> {
    const row = await this.redis.hgetall(modelKeys.rolloutTimes(tenant, job));
    const n = (field: string) => Number(row[field] ?? 0);
    const ended = Object.fromEntries(RolloutEnd.options.map((end) => [end, n(`ended:${end}`)])) as JobRolloutTimes['ended'];
    const endedCount = Object.values(ended).reduce((a, b) => a + b, 0);
    return {
      job,
      ended,
      completionRate: endedCount > 0 ? ended.succeeded / endedCount : null,
      timed: n('timed'),
      timesMs: Object.fromEntries(TIME_FIELDS.map((field) => [field, n(`ms:${field}`)])) as RolloutTimesMs,
    };
  }

  /** The `limit` jobs whose rollouts ended last, latest first, every tenant's (the operator console's). */
  async latest(limit: number): Promise<(JobRolloutTimes & { tenant: string })[]> {
    const members = await this.redis.zrevrange(LATEST_JOBS_KEY, 0, limit - 1);
    return Promise.all(
      members.map(async (member) => {
        const [tenant, job] = JSON.parse(member) as [string, string];
        return { tenant, ...(await this.read(tenant, job)) };
      }),
    );
  }
}
