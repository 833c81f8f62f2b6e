import { Queue, Worker, type Job } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { BatchOptions, BatchTask } from '../../api/index.ts';
import { JOB_KEY_PREFIX, JobWorkerWatchdog, jobQueueName } from '../../queues/jobs/index.ts';

/** A batch task's BullMQ job: its data is the task itself. */
export type TaskJob = Job<BatchTask, void, string>;

export interface BatchJobsDeps {
  /** BullMQ's own connection (connectJobRedis): Queues share it, each Worker duplicates it once for its blocking client. */
  connection: Redis;
  /** A fetched job's lock: renewed every third of it by its runner; lapsed (the gateway died), the stalled check puts the job back. */
  lockMs: number;
  /** A job whose lock lapsed went back to wait (seen by this gateway's stalled check). */
  onStalled: (batchId: string, customId: string) => void;
  /** The watchdog's interval for each Worker. */
  watchdogIntervalMs: number;
  logger: Logger;
}

/** Each queue's BullMQ event stream is capped this small: rollbox's own result stream is what callers follow. */
const EVENTS_MAX_LEN = 100;
/** Failed jobs (a task's own failure, kept for operators) per batch queue; the queue goes whole once the batch is recorded. */
const FAILED_KEPT = 1000;
/** Infra retries wait 1 s, 2 s, 4 s, ... (jittered), not at once. */
const RETRY_BACKOFF = { type: 'exponential', delay: 1000, jitter: 0.5 } as const;
/**
 * BullMQ fails a job stalled more than maxStalledCount times without a result line; rollbox
 * counts stalls as attempts itself (lua/batch.lua `begin`) and ends the task at maxAttempts,
 * so BullMQ's own limit is set out of the way.
 */
const STALLS_LEFT_TO_ROLLBOX = 1_000_000;

/** `customId` may hold ':' (BullMQ job ids may not) but never '~': a reversible job id. */
export const taskJobId = (customId: string) => `t.${customId.replaceAll(':', '~')}`;
export const customIdOfJob = (jobId: string) => jobId.slice(2).replaceAll('~', ':');

interface BatchWorker {
  worker: Worker<BatchTask, void, string>;
  watchdog: JobWorkerWatchdog;
  started: number;
  /** A fetch this interval found nothing while the batch had tasks queued (what the watchdog asks about). */
  cameUpEmpty: boolean;
  active: number;
}

/**
 * The BullMQ side of evaluation batches: one queue per batch (`batch-{<batchId>}`, its keys
 * in one Redis Cluster slot under `rb:jobs:`), one job per task (id `t.<customId>`), fetched
 * by hand (`getNextJob`), so the gateway's fair chooser decides which batch's queue a free
 * slot takes from next. Each gateway keeps a Worker per active batch, without a processor:
 * for those fetches and for BullMQ's stalled check, which puts a dead gateway's jobs back.
 */
export class BatchJobs {
  private readonly queues = new Map<string, Queue<BatchTask, void, string>>();
  private readonly workers = new Map<string, BatchWorker>();

  constructor(private readonly deps: BatchJobsDeps) {}

  /** The queues of the batches this gateway has touched (for the operators' queue view). */
  openQueues(): Queue[] {
    return [...this.queues.values()];
  }

  queueName(batchId: string): string {
    return jobQueueName('batch', batchId);
  }

  private queue(batchId: string): Queue<BatchTask, void, string> {
    let q = this.queues.get(batchId);
    if (!q) {
      q = new Queue<BatchTask, void, string>(this.queueName(batchId), { connection: this.deps.connection, prefix: JOB_KEY_PREFIX, streams: { events: { maxLen: EVENTS_MAX_LEN } } });
      q.on('error', (err) => this.deps.logger.warn({ batchId, err: String(err) }, 'batch queue error'));
      this.queues.set(batchId, q);
    }
    return q;
  }

  /** A new batch's queue: at most maxConcurrency of its jobs active at once, over every gateway (BullMQ's global concurrency). */
  async prepare(batchId: string, options: Pick<BatchOptions, 'maxConcurrency'>): Promise<void> {
    await this.queue(batchId).setGlobalConcurrency(options.maxConcurrency);
  }

  /**
   * The tasks' jobs. Their customIds were claimed first (BatchStore.addTasks, HSETNX), since
   * BullMQ answers a duplicate job id with the existing job and says nothing.
   */
  async add(batchId: string, tasks: readonly BatchTask[], options: Pick<BatchOptions, 'maxAttempts'>): Promise<void> {
    if (tasks.length === 0) return;
    await this.queue(batchId).addBulk(
      tasks.map((task) => ({
        name: 'task',
        data: task,
        opts: { jobId: taskJobId(task.customId), attempts: options.maxAttempts, backoff: RETRY_BACKOFF, removeOnComplete: true, removeOnFail: { count: FAILED_KEPT } },
      })),
    );
  }

  /** The batch's next job for this gateway, locked to `token`; undefined when none may start (none waiting, or its maxConcurrency reached). */
  async fetch(batchId: string, token: string): Promise<TaskJob | undefined> {
    const w = this.workerOf(batchId);
    const job = (await w.worker.getNextJob(token, { block: false })) as TaskJob | undefined;
    if (job) w.started++;
    else w.cameUpEmpty = true;
    return job;
  }

  /** Counts the batch's jobs this gateway runs (the watchdog's `active`). */
  ran(batchId: string, delta: 1 | -1): void {
    const w = this.workers.get(batchId);
    if (w) w.active += delta;
  }

  /**
   * Workers (stalled checks) exactly for these batches: every gateway that runs tasks
   * watches every active batch, so a dead gateway's jobs come back even when no other
   * gateway would fetch from that batch otherwise. A batch that ended loses its Worker here.
   */
  async watch(batchIds: ReadonlySet<string>): Promise<void> {
    for (const id of batchIds) this.workerOf(id);
    for (const id of [...this.workers.keys()]) if (!batchIds.has(id)) await this.closeWorker(id);
  }

  /** Renews the locks of the jobs this gateway runs (manual fetching has no automatic renewal). */
  async extendLocks(batchId: string, jobs: readonly { jobId: string; token: string }[]): Promise<void> {
    const w = this.workers.get(batchId);
    if (w && jobs.length > 0) {
      await w.worker.extendJobLocks(
        jobs.map((j) => j.jobId),
        jobs.map((j) => j.token),
        this.deps.lockMs,
      );
    }
  }

  /** Waiting and delayed jobs go (a cancelled or expired batch: their tasks ended in the store already). */
  async drain(batchId: string): Promise<void> {
    await this.queue(batchId).drain(true);
  }

  /** The batch ended and its results are recorded: its queue goes whole, so it costs no key and no polling. */
  async remove(batchId: string): Promise<void> {
    await this.closeWorker(batchId);
    const q = this.queue(batchId);
    await q.obliterate({ force: true });
    this.queues.delete(batchId);
    await q.close();
  }

  /** A waiting task's place in its batch's queue (0: next), or undefined when its job is not waiting. */
  async position(batchId: string, customId: string): Promise<number | undefined> {
    const q = this.queue(batchId);
    const redis = this.deps.connection;
    const [len, index] = await Promise.all([redis.llen(q.keys.wait!), redis.lpos(q.keys.wait!, taskJobId(customId))]);
    // BullMQ pushes new jobs on the left and takes from the right.
    return index === null ? undefined : len - 1 - index;
  }

  async close(): Promise<void> {
    for (const id of [...this.workers.keys()]) await this.closeWorker(id);
    for (const q of this.queues.values()) await q.close();
    this.queues.clear();
  }

  private workerOf(batchId: string): BatchWorker {
    let w = this.workers.get(batchId);
    if (!w) {
      const worker = this.newWorker(batchId);
      const entry: BatchWorker = {
        worker,
        started: 0,
        cameUpEmpty: false,
        active: 0,
        watchdog: new JobWorkerWatchdog(
          {
            active: () => entry.active,
            started: () => entry.started,
            // Only a fetch that came up empty is suspect: a batch the chooser did not offer to is idle by choice.
            waiting: async () => {
              const suspect = entry.cameUpEmpty;
              entry.cameUpEmpty = false;
              return suspect ? this.queue(batchId).getWaitingCount() : 0;
            },
            restart: async () => {
              await entry.worker.close(true);
              entry.worker = this.newWorker(batchId);
            },
          },
          this.deps.watchdogIntervalMs,
          (waiting) => this.deps.logger.warn({ batchId, waiting }, 'batch worker fetched nothing while jobs waited: restarting it'),
          (err) => this.deps.logger.warn({ batchId, err: String(err) }, 'batch worker watchdog failed'),
        ),
      };
      entry.watchdog.start();
      this.workers.set(batchId, entry);
      w = entry;
    }
    return w;
  }

  private newWorker(batchId: string): Worker<BatchTask, void, string> {
    const lockMs = this.deps.lockMs;
    const worker = new Worker<BatchTask, void, string>(this.queueName(batchId), null, {
      connection: this.deps.connection,
      prefix: JOB_KEY_PREFIX,
      autorun: false,
      lockDuration: lockMs,
      // A dead gateway's job is back within about lockMs + 2 checks.
      stalledInterval: Math.max(500, Math.round(lockMs / 3)),
      maxStalledCount: STALLS_LEFT_TO_ROLLBOX,
    });
    worker.on('error', (err) => this.deps.logger.warn({ batchId, err: String(err) }, 'batch worker error'));
    worker.on('stalled', (jobId) => this.deps.onStalled(batchId, customIdOfJob(jobId)));
    void worker.startStalledCheckTimer().catch((err: unknown) => this.deps.logger.warn({ batchId, err: String(err) }, 'batch stalled check did not start'));
    return worker;
  }

  private async closeWorker(batchId: string): Promise<void> {
    const w = this.workers.get(batchId);
    if (!w) return;
    this.workers.delete(batchId);
    w.watchdog.stop();
    await w.worker.close(true).catch((err: unknown) => this.deps.logger.warn({ batchId, err: String(err) }, 'closing a batch worker failed'));
  }
}
