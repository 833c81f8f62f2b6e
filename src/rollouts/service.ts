import { RollboxError, type CommandRecord, type JobRolloutTimes, type ModelCallRecord, type Rollout, type RolloutRecord, type RolloutTimesMs, type Trajectory } from '../api/index.ts';
import { requireScope, type Principal } from '../iam/index.ts';
import type { BatchStore, CommandLog, RolloutRecords } from '../registry/index.ts';
import type { ModelCallLog, RolloutLimits } from '../model-gateway/index.ts';
import type { JobRolloutTimesStore } from './job-times.ts';
import { rolloutTimes } from './times.ts';
import { interleave } from './trajectory.ts';

export interface RolloutServiceDeps {
  records: Pick<RolloutRecords, 'get' | 'put'>;
  calls: Pick<ModelCallLog, 'list'>;
  limits: Pick<RolloutLimits, 'usage'>;
  commands: Pick<CommandLog, 'page'>;
  batches: Pick<BatchStore, 'taskStatus'>;
  jobTimes: Pick<JobRolloutTimesStore, 'read'>;
}

/** A trajectory past this many model calls or commands is cut there (and says so in its error). */
const MAX_TRAJECTORY_ENTRIES = 20_000;
const PAGE = 1000;

/**
 * Hosted rollouts as their trainer and their own agent read them: the attempt's record with
 * its task's state and model usage, and its trajectory. A tenant reads its own (scope
 * `rollout:submit` or `batch:submit`); a rollout key reads its own rollout only.
 */
export class RolloutService {
  constructor(private readonly deps: RolloutServiceDeps) {}

  async get(principal: Principal, id: string): Promise<Rollout> {
    const record = await this.owned(principal, id);
    const [task, usage] = await Promise.all([this.deps.batches.taskStatus(record.batchId, record.customId), this.deps.limits.usage(id)]);
    return { ...record, task, usage: { modelCalls: usage.calls, tokens: usage.tokens, ...(usage.hit ? { hit: usage.hit } : {}) } };
  }

  /**
   * The attempt's model calls and its task sandbox's commands, in the order they began. The
   * logs outlive the sandboxes (they expire with the model-call records), so a finished
   * rollout reads whole.
   */
  async trajectory(principal: Principal, id: string): Promise<Trajectory> {
    const record = await this.owned(principal, id);
    const { calls, commands } = await this.logsOf(record);
    return { rolloutId: id, entries: interleave(calls, commands.map((command) => ({ sandboxId: record.taskSandboxId, command }))) };
  }

  /**
   * Where the rollout's time went, from its start (its record's first create) to its end at
   * `endedAtMs`: computed once, when its agent exits or a cancel ends it, from its logs, and
   * kept with its record. Undefined when its record is gone.
   */
  async finish(id: string, endedAtMs: number): Promise<RolloutTimesMs | undefined> {
    const record = await this.deps.records.get(id);
    if (!record) return undefined;
    const { calls, commands } = await this.logsOf(record);
    const envWaits = record.envWaits ?? [];
    const fromMs = Math.min(Date.parse(record.createdAt), ...envWaits.map((w) => w.fromMs));
    const timesMs = rolloutTimes({ window: { fromMs, toMs: endedAtMs }, envWaits, calls, commands });
    await this.deps.records.put({ ...record, timesMs });
    return timesMs;
  }

  /** `GET /v1/jobs/:job/rollout-times`: the tenant's job's ended rollouts and their times. */
  jobTimes(principal: Principal, job: string): Promise<JobRolloutTimes> {
    requireScope(principal, 'rollout:submit', 'batch:submit');
    return this.deps.jobTimes.read(principal.tenant, job);
  }

  /** The rollout's model calls and its task sandbox's commands (each cut at MAX_TRAJECTORY_ENTRIES). */
  private async logsOf(record: RolloutRecord): Promise<{ calls: ModelCallRecord[]; commands: CommandRecord[] }> {
    const calls: ModelCallRecord[] = [];
    for (let after = 0; calls.length < MAX_TRAJECTORY_ENTRIES; ) {
      const page = await this.deps.calls.list(record.id, { after, limit: PAGE });
      calls.push(...page.calls);
      if (page.calls.length < PAGE) break;
      after = page.nextAfter;
    }
    const commands: CommandRecord[] = [];
    for (let after: string | undefined; commands.length < MAX_TRAJECTORY_ENTRIES; ) {
      const page = await this.deps.commands.page(record.taskSandboxId, { ...(after ? { after } : {}), limit: PAGE });
      commands.push(...page.commands);
      if (!page.nextCursor) break;
      after = page.nextCursor;
    }
    return { calls, commands };
  }

  private async owned(principal: Principal, id: string): Promise<RolloutRecord> {
    if (principal.rollout) {
      if (principal.rollout.id !== id) throw new RollboxError('not_found', `rollout ${id} not found`);
    } else requireScope(principal, 'rollout:submit', 'batch:submit');
    const record = await this.deps.records.get(id);
    if (!record || record.tenant !== principal.tenant) throw new RollboxError('not_found', `rollout ${id} not found`);
    return record;
  }
}
