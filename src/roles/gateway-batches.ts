import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { Config } from '../config/index.ts';
import { BatchJobs, BatchRunner, BatchService, runTask, type BatchServiceDeps, type TaskDeps, type TaskEnded } from '../gateway/index.ts';
import { connectJobRedis } from '../queues/jobs/index.ts';
import type { BlockingPool } from '../redis/index.ts';
import { BatchStore } from '../registry/index.ts';

/** How often each batch Worker's watchdog looks (one LLEN per look, and only after a fetch found nothing). */
const JOB_WATCHDOG_INTERVAL_MS = 10_000;

/**
 * Part of the composition root (roles/index.ts), built from config: a gateway's evaluation batches.
 * Their tasks are BullMQ jobs (one queue per batch) on BullMQ's own connection (no
 * auto-pipelining; commands wait out a Redis restart); the runner fetches them in fair order.
 * `stop` hands back what runs here and closes that connection.
 */
export function batchesOf(
  config: Config,
  redisUrl: string,
  redis: Redis,
  blocking: BlockingPool,
  taskDeps: Omit<TaskDeps, 'store' | 'collectMaxBytes'>,
  logger: Logger,
  now: () => number,
  onTaskEnded: ((ended: TaskEnded) => void | Promise<void>) | undefined,
  requireValidated: BatchServiceDeps['requireValidated'],
): { batches: BatchService; runner: BatchRunner; jobs: BatchJobs; stop: () => Promise<void> } {
  const store = new BatchStore(redis, now);
  const jobRedis = connectJobRedis(redisUrl, (err) => logger.warn({ err: String(err) }, 'job redis error'));
  const jobs = new BatchJobs({
    connection: jobRedis,
    lockMs: config.batch.jobLockMs,
    onStalled: (batchId, customId) => void runner.stalled(batchId, customId).catch((err: unknown) => logger.warn({ batchId, customId, err: String(err) }, 'releasing a stalled batch task failed')),
    watchdogIntervalMs: JOB_WATCHDOG_INTERVAL_MS,
    logger: logger.child({ name: 'batch-jobs' }),
  });
  const runner = new BatchRunner({
    store,
    jobs,
    execute: (run) => runTask({ ...taskDeps, store, collectMaxBytes: config.files.maxBytes }, run),
    slots: config.batch.slots,
    lockMs: config.batch.jobLockMs,
    tenantWeights: config.batch.tenantWeights,
    now,
    logger: logger.child({ name: 'batches' }),
    ...(onTaskEnded ? { onTaskEnded } : {}),
  });
  const batches = new BatchService({ store, jobs, blocking, kick: () => runner.kick(), maxNdjsonBytes: config.batch.maxBytes, requireValidated });
  return {
    batches,
    runner,
    jobs,
    stop: async () => {
      await runner.stop();
      await jobRedis.quit().catch(() => {});
    },
  };
}
