import { randomUUID } from 'node:crypto';
import { UnrecoverableError } from 'bullmq';
import type { Logger } from 'pino';
import { BatchTask } from '../../api/index.ts';
import type { BatchLoad, BatchStore, ResultLineInput } from '../../registry/index.ts';
import type { BatchJobs, TaskJob } from './jobs.ts';
import { TaskCancelled, type TaskOutcome, type TaskRun } from './task.ts';

export interface BatchRunnerDeps {
  store: Pick<BatchStore, 'loads' | 'begin' | 'finish' | 'release' | 'cancel' | 'state' | 'forget'>;
  jobs: Pick<BatchJobs, 'fetch' | 'ran' | 'watch' | 'extendLocks' | 'drain' | 'remove' | 'close'>;
  /** Runs one attempt of a task (task.ts's runTask with its dependencies bound). */
  execute: (run: TaskRun) => Promise<TaskOutcome>;
  /** Tasks this gateway runs at once, over every batch. */
  slots: number;
  /** A fetched job's lock, renewed every third of it while the task runs (BatchJobs' lockMs). */
  lockMs: number;
  /** Relative shares of tenants (default 1 each). */
  tenantWeights: Readonly<Record<string, number>>;
  now: () => number;
  logger: Logger;
  /** Told once per task that ends (its result line recorded): the console's completion rate, a rollout job's times. Awaited; its failure is logged. */
  onTaskEnded?: (ended: TaskEnded) => void | Promise<void>;
}

/** A task whose result line was recorded. */
export interface TaskEnded {
  tenant: string;
  task: BatchTask;
  line: ResultLineInput;
}

interface Local {
  batchId: string;
  customId: string;
  job: TaskJob;
  token: string;
  controller: AbortController;
  done: Promise<void>;
}

const TICK_MS = 200;
/** A batch whose task found no room (quota, capacity) is not offered to again for this long; its job waits as long (delayed, uncharged). */
const BACKPRESSURE_PAUSE_MS = 1000;
const TERMINAL: ReadonlySet<string> = new Set(['completed', 'cancelled', 'failed', 'expired']);

/**
 * The next batch to take a task from: tenants share fairly (the one with the fewest running
 * tasks for its weight goes first), and so do a tenant's batches (fewest running first,
 * then the oldest). A batch at its maxConcurrency or with nothing queued is skipped.
 */
export function pickBatch(loads: readonly BatchLoad[], weights: Readonly<Record<string, number>>): BatchLoad | undefined {
  const runningByTenant = new Map<string, number>();
  for (const l of loads) runningByTenant.set(l.tenant, (runningByTenant.get(l.tenant) ?? 0) + l.running);
  const open = loads.filter((l) => l.state === 'in_progress' && l.queued > 0 && l.running < l.options.maxConcurrency);
  const share = (l: BatchLoad) => (runningByTenant.get(l.tenant) ?? 0) / (weights[l.tenant] ?? 1);
  return [...open].sort((a, b) => share(a) - share(b) || a.running - b.running || a.createdAtMs - b.createdAtMs)[0];
}

/**
 * Every gateway runs one: it fetches jobs from active batches' BullMQ queues into its free
 * slots, in fair order (pickBatch chooses the queue), runs them, records each one's result
 * once and then settles its job (completed; failed unrecoverably for the task's own failure;
 * failed with a retry for an infra failure; delayed, uncharged, when there was no room),
 * renews the locks of what it runs, cancels what is cancelled, expires what outlived its
 * completion window, and removes a batch's queue once the batch has ended.
 */
export class BatchRunner {
  private readonly local = new Map<string, Local>();
  private readonly paused = new Map<string, number>();
  private timer: NodeJS.Timeout | undefined;
  private renewTimer: NodeJS.Timeout | undefined;
  private ticking = false;
  private again = false;
  private stopped = false;

  constructor(private readonly deps: BatchRunnerDeps) {}

  start(): void {
    this.timer = setInterval(() => this.kick(), TICK_MS);
    this.renewTimer = setInterval(() => void this.renew().catch((err: unknown) => this.deps.logger.warn({ err: String(err) }, 'batch job lock renewal failed')), this.deps.lockMs / 3);
  }

  /** Stops fetching; tasks running here are stopped and their jobs wait again (their attempt not charged). */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    clearInterval(this.renewTimer);
    for (const l of this.local.values()) l.controller.abort(new Error('the gateway is stopping'));
    await Promise.all([...this.local.values()].map((l) => l.done));
    while (this.ticking) await new Promise((r) => setTimeout(r, 20));
    await this.deps.jobs.close();
  }

  /** Looks for work now (after a submit, or when a task ended). */
  kick(): void {
    if (this.stopped) return;
    if (this.ticking) {
      this.again = true;
      return;
    }
    this.ticking = true;
    void this.tick()
      .catch((err: unknown) => this.deps.logger.warn({ err: String(err) }, 'batch scheduling failed'))
      .finally(() => {
        this.ticking = false;
        if (this.again) {
          this.again = false;
          this.kick();
        }
      });
  }

  /** A job whose lock lapsed went back to wait: its task no longer counts as running (the next attempt is charged). */
  async stalled(batchId: string, customId: string): Promise<void> {
    this.deps.logger.warn({ batchId, customId }, 'a batch task whose runner stopped waits again');
    await this.deps.store.release(batchId, customId, true);
  }

  private async tick(): Promise<void> {
    const { store, jobs, now } = this.deps;
    const loads = await store.loads();
    const nowMs = now();
    // One batch's trouble (its queue's Redis call failing) must not stop the others' scheduling.
    const each = async (l: BatchLoad, what: string, fn: () => Promise<void>) =>
      fn().catch((err: unknown) => this.deps.logger.warn({ batchId: l.id, err: String(err) }, `${what} failed; tried again next tick`));
    for (const l of loads) {
      if (l.state === 'in_progress' && nowMs > l.expiresAtMs) {
        await each(l, 'expiring a batch', async () => {
          l.state = await store.cancel(l.id, 'expired', 'the completion window ended before the task ran');
          await jobs.drain(l.id);
        });
      }
    }
    // Ended batches: their results are recorded, so their queues go (any gateway may; obliterate is idempotent).
    for (const l of loads.filter((b) => TERMINAL.has(b.state))) {
      await each(l, 'removing an ended batch\'s queue', async () => {
        await jobs.remove(l.id);
        await store.forget(l.id);
        this.paused.delete(l.id);
      });
    }
    const live = loads.filter((l) => !TERMINAL.has(l.state) && l.state !== 'validating');
    if (this.deps.slots > 0) await jobs.watch(new Set(live.map((l) => l.id)));
    // Batches being cancelled: stop what runs here.
    for (const l of this.local.values()) {
      if (loads.find((b) => b.id === l.batchId)?.state !== 'in_progress') l.controller.abort(new TaskCancelled('the batch was cancelled'));
    }
    let candidates = live.filter((l) => (this.paused.get(l.id) ?? 0) <= nowMs);
    while (!this.stopped && this.local.size < this.deps.slots) {
      const pick = pickBatch(candidates, this.deps.tenantWeights);
      if (!pick) return;
      const token = randomUUID();
      const job = await jobs.fetch(pick.id, token);
      if (!job) {
        candidates = candidates.filter((c) => c !== pick);
        continue;
      }
      pick.running++;
      pick.queued--;
      await this.launch(pick, job, token);
    }
  }

  private async launch(batch: BatchLoad, job: TaskJob, token: string): Promise<void> {
    const { store, logger } = this.deps;
    const customId = job.data.customId;
    const task = BatchTask.parse(job.data);
    const attempt = await store.begin(batch.id, customId);
    if (attempt === undefined) {
      // Its result is recorded (a runner died between recording and completing the job, or it was cancelled).
      await job.moveToCompleted(undefined, token, false).catch(() => undefined);
      return;
    }
    if (attempt > batch.options.maxAttempts) {
      // Stalled (its runners died) more often than it may run.
      await this.record({ tenant: batch.tenant, task }, batch.id, job, token, { customId, status: 'infra_error', steps: [], attempts: attempt - 1, error: { code: 'node_lost', message: `the task's runner was lost ${attempt - 1} times` } }, 'failed');
      return;
    }
    const controller = new AbortController();
    const run = { batchId: batch.id, tenant: batch.tenant, options: batch.options, customId, attempt, task };
    const key = `${batch.id}/${customId}`;
    this.deps.jobs.ran(batch.id, 1);
    const done = this.deps
      .execute({ ...run, signal: controller.signal })
      .catch((err: unknown): TaskOutcome => ({ kind: 'infra', error: { code: 'internal', message: String(err) }, steps: [] }))
      .then((outcome) => this.settle(run, job, token, outcome))
      .catch((err: unknown) => logger.error({ batchId: batch.id, customId, err: String(err) }, 'recording a batch task failed; its job lock will lapse and it runs again'))
      .finally(() => {
        this.deps.jobs.ran(batch.id, -1);
        this.local.delete(key);
        this.kick();
      });
    this.local.set(key, { batchId: batch.id, customId, job, token, controller, done });
  }

  private async settle(run: Omit<TaskRun, 'signal'>, job: TaskJob, token: string, outcome: TaskOutcome): Promise<void> {
    const { store } = this.deps;
    switch (outcome.kind) {
      case 'result':
        await this.record(run, run.batchId, job, token, outcome.line, outcome.line.status === 'succeeded' ? 'completed' : 'failed');
        return;
      case 'backpressure':
        this.paused.set(run.batchId, this.deps.now() + BACKPRESSURE_PAUSE_MS);
        await store.release(run.batchId, run.customId, false);
        // Delayed, not failed: no attempt charged (BullMQ's skipAttempt), back after the pause.
        await job.moveToDelayed(Date.now() + BACKPRESSURE_PAUSE_MS, token);
        return;
      case 'aborted': {
        const state = await store.state(run.batchId);
        if (state === 'cancelling' || state === 'cancelled' || state === 'expired') {
          const line: ResultLineInput = { customId: run.customId, status: 'cancelled', steps: outcome.steps, attempts: run.attempt, error: { code: 'cancelled', message: 'the batch was cancelled while the task ran' } };
          // A rollout the cancel ended: its model usage and its times up to the cancel, counted with its job's ended rollouts.
          await this.record(run, run.batchId, job, token, outcome.rollout ? { ...line, rollout: outcome.rollout } : line, 'completed');
        } else {
          await store.release(run.batchId, run.customId, false);
          await job.moveToWait(token);
        }
        return;
      }
      case 'infra':
        this.deps.logger.warn({ batchId: run.batchId, customId: run.customId, attempt: run.attempt, error: outcome.error }, 'batch task attempt failed (platform)');
        if (run.attempt >= run.options.maxAttempts) {
          await this.record(run, run.batchId, job, token, { customId: run.customId, status: 'infra_error', steps: outcome.steps, attempts: run.attempt, error: outcome.error }, 'failed');
        } else {
          await store.release(run.batchId, run.customId, true);
          // A retryable failure: BullMQ waits its backoff, then the job is fetched again.
          await job.moveToFailed(new Error(`${outcome.error.code}: ${outcome.error.message}`), token, false);
        }
    }
  }

  /**
   * The task's one result line first, then its job settles; a gateway dying in between
   * leaves a job whose next fetch finds the result and only completes it. The job of a task
   * that failed on its own is failed unrecoverably (no retry; operators see it as failed).
   */
  private async record(of: Pick<TaskEnded, 'tenant' | 'task'>, batchId: string, job: TaskJob, token: string, line: ResultLineInput, as: 'completed' | 'failed'): Promise<void> {
    const { cursor } = await this.deps.store.finish(batchId, line);
    // Only a line the store took counts: a task ends once.
    if (cursor !== undefined) {
      await Promise.resolve(this.deps.onTaskEnded?.({ ...of, line })).catch((err: unknown) => this.deps.logger.warn({ batchId, customId: line.customId, err: String(err) }, 'counting an ended batch task failed'));
    }
    const settled = as === 'completed' ? job.moveToCompleted(undefined, token, false) : job.moveToFailed(new UnrecoverableError(line.error?.message ?? `the task ended ${line.status}`), token, false);
    // The lock may have lapsed (the job stalled and another gateway has it): the result is recorded either way.
    await settled.catch((err: unknown) => this.deps.logger.warn({ batchId, customId: line.customId, err: String(err) }, 'settling a batch job after its result failed'));
  }

  private async renew(): Promise<void> {
    const byBatch = new Map<string, { jobId: string; token: string }[]>();
    for (const l of this.local.values()) byBatch.set(l.batchId, [...(byBatch.get(l.batchId) ?? []), { jobId: l.job.id!, token: l.token }]);
    for (const [batchId, jobs] of byBatch) await this.deps.jobs.extendLocks(batchId, jobs);
  }
}
