/**
 * bench:batch-fetch — how a gateway should take batch jobs from BullMQ, on no-op jobs (so the
 * figure is BullMQ's own cost): manual fetching (a Worker without a processor per batch,
 * `getNextJob` into free slots in the chooser's order, the shape src/gateway/batches uses)
 * against a Worker with a processor per batch (the gateway's slots split between them).
 * Jobs/s and Redis calls per job (INFO commandstats) with one batch and with four at once,
 * on a redis-server of its own. One JSON line last.
 */
import { randomUUID } from 'node:crypto';
import os from 'node:os';
import path from 'node:path';
import { Queue, Worker } from 'bullmq';
import { JOB_KEY_PREFIX, connectJobRedis, jobQueueName } from '../src/queues/jobs/index.ts';
import { startRedisServer } from '../src/redis/index.ts';
import { redisCallsSoFar } from './support/redis-calls.ts';

const JOBS = Number(process.env.BENCH_JOBS ?? 2000);
const SLOTS = 16;

const server = await startRedisServer({ dataDir: path.join(os.tmpdir(), `rb-batch-fetch-${process.pid}`), persist: false });
const redis = connectJobRedis(server.url);
let round = 0;

async function fill(batches: number): Promise<{ queues: Queue[]; names: string[] }> {
  round++;
  const names = Array.from({ length: batches }, (_, i) => jobQueueName('batch', `bench${round}x${i}`));
  const queues = names.map((n) => new Queue(n, { connection: redis, prefix: JOB_KEY_PREFIX, streams: { events: { maxLen: 100 } } }));
  for (const q of queues) {
    for (let i = 0; i < JOBS / batches; i += 500) {
      await q.addBulk(Array.from({ length: Math.min(500, JOBS / batches - i) }, (_, j) => ({ name: 'task', data: { n: i + j }, opts: { jobId: `t.${i + j}`, removeOnComplete: true } })));
    }
  }
  return { queues, names };
}

/** SLOTS loops; each takes the next batch in turn (a stand-in for pickBatch) and fetches without blocking. */
async function manual(batches: number): Promise<{ ms: number; calls: number }> {
  const { queues, names } = await fill(batches);
  const workers = names.map((n) => new Worker(n, null, { connection: redis, prefix: JOB_KEY_PREFIX, autorun: false }));
  const before = await redisCallsSoFar(redis);
  const started = performance.now();
  let next = 0;
  let done = 0;
  await Promise.all(
    Array.from({ length: SLOTS }, async () => {
      let empty = 0;
      while (done < JOBS && empty < batches) {
        const w = workers[next++ % batches]!;
        const token = randomUUID();
        const job = await w.getNextJob(token, { block: false });
        if (!job) {
          empty++;
          continue;
        }
        empty = 0;
        await job.moveToCompleted(undefined, token, false);
        done++;
      }
    }),
  );
  const ms = performance.now() - started;
  const calls = (await redisCallsSoFar(redis)) - before;
  await Promise.all(workers.map((w) => w.close()));
  await Promise.all(queues.map(async (q) => (await q.obliterate({ force: true }), q.close())));
  return { ms, calls };
}

/** A Worker with a processor per batch, the slots split between them. */
async function perBatchWorkers(batches: number): Promise<{ ms: number; calls: number }> {
  const { queues, names } = await fill(batches);
  let done = 0;
  let finish!: () => void;
  const finished = new Promise<void>((r) => (finish = r));
  const before = await redisCallsSoFar(redis);
  const started = performance.now();
  const workers = names.map((n) => new Worker(n, async () => void (++done === JOBS && finish()), { connection: redis, prefix: JOB_KEY_PREFIX, concurrency: Math.max(1, SLOTS / batches) }));
  await finished;
  const ms = performance.now() - started;
  await Promise.all(workers.map((w) => w.close()));
  const calls = (await redisCallsSoFar(redis)) - before;
  await Promise.all(queues.map(async (q) => (await q.obliterate({ force: true }), q.close())));
  return { ms, calls };
}

const rows: Record<string, { jobsPerSecond: number; redisCallsPerJob: number }> = {};
try {
  for (const batches of [1, 4]) {
    for (const [name, run] of [['manual', manual], ['workerPerBatch', perBatchWorkers]] as const) {
      const { ms, calls } = await run(batches);
      rows[`${name}.${batches}`] = { jobsPerSecond: Math.round((JOBS / ms) * 1000), redisCallsPerJob: Math.round((calls / JOBS) * 10) / 10 };
      process.stderr.write(`${name}, ${batches} batch(es): ${JSON.stringify(rows[`${name}.${batches}`])}\n`);
    }
  }
  const ratio = (b: number) => Math.round((rows[`manual.${b}`]!.jobsPerSecond / rows[`workerPerBatch.${b}`]!.jobsPerSecond) * 100) / 100;
  console.log(JSON.stringify({ bench: 'batch-fetch', jobs: JOBS, slots: SLOTS, rows, manualOverWorkersJobsPerSecond: { oneBatch: ratio(1), fourBatches: ratio(4) } }));
} finally {
  redis.disconnect();
  await server.stop();
}
