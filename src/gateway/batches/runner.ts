import type { Logger } from 'pino';
import type { BatchOptions } from '../../api/index.ts';
import type { BatchLoad, BatchStore } from '../../registry/index.ts';
import type { TaskOutcome, TaskRun } from './task.ts';

export interface BatchRunnerDeps {
  store: Pick<BatchStore, 'loads' | 'claim' | 'finish' | 'requeue' | 'renew' | 'reclaim' | 'cancel' | 'state'>;
  /** Runs one attempt of a task (task.ts's runTask with its dependencies bound). */
  execute: (run: TaskRun) => Promise<TaskOutcome>;
  /** Tasks this gateway runs at once, over every batch. */
  slots: number;
  /** A task's lease: renewed every third of it while it runs; lapsed, another gateway takes the task again. */
  leaseMs: number;
  /** Relative shares of tenants (default 1 each). */
  tenantWeights: Readonly<Record<string, number>>;
  now: () => number;
  logger: Logger;
  /** Told once per task that ended here (the console's task completion rate). */
  onTaskEnded?: (succeeded: boolean) => void;
}

interface Local {
  batchId: string;
  customId: string;
  controller: AbortController;
  done: Promise<void>;
}

const TICK_MS = 200;
/** A batch whose task found no room (quota, capacity) is not offered to again for this long. */
const BACKPRESSURE_PAUSE_MS = 1000;

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
 * Every gateway runs one: it claims tasks of active batches into its free slots, in fair
 * order, runs them, records each one's result once (or queues it again), renews the leases
 * of what it runs, takes back tasks whose runner died, cancels what is cancelled and
 * expires what outlived its completion window.
 */
export class BatchRunner {
  private readonly local = new Map<string, Local>();
  private readonly paused = new Map<string, number>();
  private timer: NodeJS.Timeout | undefined;
  private renewTimer: NodeJS.Timeout | undefined;
  private ticking = false;
  private again = false;
  private stopped = false;
  private lastReclaimMs = 0;

  constructor(private readonly deps: BatchRunnerDeps) {}

  start(): void {
    this.timer = setInterval(() => this.kick(), TICK_MS);
    this.renewTimer = setInterval(() => void this.renew().catch((err: unknown) => this.deps.logger.warn({ err: String(err) }, 'batch lease renewal failed')), this.deps.leaseMs / 3);
  }

  /** Stops claiming; tasks running here are stopped and queued again (their attempt not charged). */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    clearInterval(this.renewTimer);
    for (const l of this.local.values()) l.controller.abort(new Error('the gateway is stopping'));
    await Promise.all([...this.local.values()].map((l) => l.done));
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

  private async tick(): Promise<void> {
    const { store, now } = this.deps;
    const loads = await store.loads();
    const nowMs = now();
    for (const l of loads) {
      if (l.state === 'in_progress' && nowMs > l.expiresAtMs) await store.cancel(l.id, 'expired', 'the completion window ended before the task ran');
    }
    if (nowMs - this.lastReclaimMs > 1000) {
      this.lastReclaimMs = nowMs;
      for (const l of loads) {
        const lapsed = await store.reclaim(l.id);
        if (lapsed > 0) this.deps.logger.warn({ batchId: l.id, lapsed }, 'batch tasks whose runner stopped were queued again');
      }
    }
    // Batches being cancelled: stop what runs here.
    for (const l of this.local.values()) {
      if (loads.find((b) => b.id === l.batchId)?.state !== 'in_progress') l.controller.abort(new Error('the batch was cancelled'));
    }
    let candidates = loads.filter((l) => (this.paused.get(l.id) ?? 0) <= nowMs);
    while (!this.stopped && this.local.size < this.deps.slots) {
      const pick = pickBatch(candidates, this.deps.tenantWeights);
      if (!pick) return;
      const claimed = await store.claim(pick.id, now() + this.deps.leaseMs);
      if (!claimed) {
        candidates = candidates.filter((c) => c !== pick);
        continue;
      }
      pick.running++;
      pick.queued--;
      this.launch({ batchId: pick.id, tenant: pick.tenant, options: pick.options, customId: claimed.customId, attempt: claimed.attempt, task: claimed.task });
    }
  }

  private launch(run: Omit<TaskRun, 'signal'>): void {
    const controller = new AbortController();
    const key = `${run.batchId}/${run.customId}`;
    const done = this.deps
      .execute({ ...run, signal: controller.signal })
      .catch((err: unknown): TaskOutcome => ({ kind: 'infra', error: { code: 'internal', message: String(err) }, steps: [] }))
      .then((outcome) => this.settle(run, run.options, outcome))
      .catch((err: unknown) => this.deps.logger.error({ batchId: run.batchId, customId: run.customId, err: String(err) }, 'recording a batch task failed; its lease will lapse and it runs again'))
      .finally(() => {
        this.local.delete(key);
        this.kick();
      });
    this.local.set(key, { batchId: run.batchId, customId: run.customId, controller, done });
  }

  private async settle(run: Omit<TaskRun, 'signal'>, options: BatchOptions, outcome: TaskOutcome): Promise<void> {
    const { store, onTaskEnded } = this.deps;
    // Only a line the store took counts: a task ends once.
    const finish = async (batchId: string, line: Parameters<BatchRunnerDeps['store']['finish']>[1]) => {
      if ((await store.finish(batchId, line)) !== undefined) onTaskEnded?.(line.status === 'succeeded');
    };
    switch (outcome.kind) {
      case 'result':
        await finish(run.batchId, outcome.line);
        return;
      case 'backpressure':
        this.paused.set(run.batchId, this.deps.now() + BACKPRESSURE_PAUSE_MS);
        await store.requeue(run.batchId, run.customId, false);
        return;
      case 'aborted': {
        const state = await store.state(run.batchId);
        if (state === 'cancelling' || state === 'cancelled' || state === 'expired') {
          await finish(run.batchId, { customId: run.customId, status: 'cancelled', steps: outcome.steps, attempts: run.attempt, error: { code: 'cancelled', message: 'the batch was cancelled while the task ran' } });
        } else {
          await store.requeue(run.batchId, run.customId, false);
        }
        return;
      }
      case 'infra':
        this.deps.logger.warn({ batchId: run.batchId, customId: run.customId, attempt: run.attempt, error: outcome.error }, 'batch task attempt failed (platform)');
        if (run.attempt >= options.maxAttempts) {
          await finish(run.batchId, { customId: run.customId, status: 'infra_error', steps: outcome.steps, attempts: run.attempt, error: outcome.error });
        } else {
          await store.requeue(run.batchId, run.customId, true);
        }
    }
  }

  private async renew(): Promise<void> {
    const byBatch = new Map<string, string[]>();
    for (const l of this.local.values()) byBatch.set(l.batchId, [...(byBatch.get(l.batchId) ?? []), l.customId]);
    for (const [batchId, ids] of byBatch) await this.deps.store.renew(batchId, ids, this.deps.now() + this.deps.leaseMs);
  }
}

