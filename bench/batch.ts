/**
 * bench:batch — 1,000 short tasks as one evaluation batch: tasks/s beside the floor of the
 * same run (raw `runc run -d` + `runc delete -f` at the same concurrency as the gateway's
 * batch slots: a task is at least a sandbox started and removed) and the time to the first
 * result; then two tenants submitting 1,000 tasks each at once, with each tenant's share of
 * the throughput while both run. Progress on stderr, a chart in bench/out/, one JSON line last.
 */
import path from 'node:path';
import { Redis } from 'ioredis';
import type { Batch } from '../src/api/index.ts';
import { lineChartsSvg, progressBar, writeSvg } from '../src/report/index.ts';
import { api, startTestCluster, type TestCluster } from '../test/support/cluster.ts';
import { backgroundCallsPerSecond, redisCallsSoFar } from './support/redis-calls.ts';
import { rawRuncRunFloor } from './support/runc-floor.ts';

const TASKS = Number(process.env.BENCH_TASKS ?? 1000);
const SLOTS = Number(process.env.BENCH_SLOTS ?? 16);
const FLOOR_RUNS = Number(process.env.BENCH_FLOOR_RUNS ?? 300);
const NODE = 'bench-batch';

const cluster: TestCluster = await startTestCluster({
  workers: [{ nodeId: NODE, env: { ROLLBOX_NODE_MAX_STARTING: String(SLOTS * 2), ROLLBOX_NODE_MAX_SANDBOXES: String(SLOTS * 8) } }],
  env: { ROLLBOX_BATCH_SLOTS: String(SLOTS), ROLLBOX_HEARTBEAT_MS: '500', ROLLBOX_NODE_LOST_AFTER_MS: '5000', ROLLBOX_TENANT_MAX_SANDBOXES: '100000' },
});
const redis = new Redis(cluster.redisUrl);
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));

const tasksOf = (prefix: string) => Array.from({ length: TASKS }, (_, i) => ({ customId: `${prefix}${i}`, resources: { memoryMiB: 32, cpuMillis: 100 }, steps: [{ cmd: 'true', timeoutMs: 30_000 }] }));
const done = (b: Batch) => b.counts.total - b.counts.queued - b.counts.running;

try {
  const tokenA = await cluster.token('eval-a', ['batch:submit', 'sandbox:create', 'sandbox:delete']);
  const tokenB = await cluster.token('eval-b', ['batch:submit']);
  // Warm: layers mounted, scratch filesystem up.
  await api(cluster, tokenA, 'POST', '/v1/batches', { tasks: tasksOf('w').slice(0, 20), maxConcurrency: SLOTS }).then((r) => waitBatches([[tokenA, r.body.id as string]], 'warm-up'));

  const template = (await api(cluster, tokenA, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 32, cpuMillis: 100 } })).body.id as string;
  const floorBar = progressBar(`floor: raw runc run + delete (x${SLOTS})`, { total: FLOOR_RUNS });
  const floor = await rawRuncRunFloor({ workerDir: path.join(cluster.rootDir, NODE, 'worker'), templateSandboxId: template, runs: FLOOR_RUNS, concurrency: SLOTS, deleteEach: true, onRun: floorBar.tick });
  floorBar.done();
  await api(cluster, tokenA, 'DELETE', `/v1/sandboxes/${template}`);
  const floorPerSecond = round((FLOOR_RUNS / floor.wallMs) * 1000);

  // One batch. Redis calls per task: every call while it ran (its sandboxes' creates, execs
  // and deletes included) over its tasks, with and without the idle background rate.
  const backgroundPerSecond = await backgroundCallsPerSecond(redis);
  const callsBefore = await redisCallsSoFar(redis);
  const started = performance.now();
  const single = (await api<Batch>(cluster, tokenA, 'POST', '/v1/batches', { tasks: tasksOf('a'), maxConcurrency: SLOTS })).body;
  const firstResult = fetch(`${cluster.url}/v1/batches/${single.id}/results?limit=1&waitSeconds=60`, { headers: { authorization: `Bearer ${tokenA}` } }).then(() => performance.now() - started);
  const singleSeries = await waitBatches([[tokenA, single.id]], `${TASKS} tasks, one tenant`);
  const singleWallMs = performance.now() - started;
  const callsDuring = (await redisCallsSoFar(redis)) - callsBefore;
  const redisCallsPerTask = round(callsDuring / TASKS);
  const redisCallsPerTaskLessBackground = round((callsDuring - (backgroundPerSecond * singleWallMs) / 1000) / TASKS);
  const firstResultMs = round(await firstResult);

  // Two tenants at once.
  const startedBoth = performance.now();
  const [a, b] = await Promise.all([api<Batch>(cluster, tokenA, 'POST', '/v1/batches', { tasks: tasksOf('a2-'), maxConcurrency: SLOTS }), api<Batch>(cluster, tokenB, 'POST', '/v1/batches', { tasks: tasksOf('b2-'), maxConcurrency: SLOTS })]);
  const bothSeries = await waitBatches([[tokenA, a.body.id], [tokenB, b.body.id]], `2 x ${TASKS} tasks, two tenants`);
  const bothWallMs = performance.now() - startedBoth;
  // Shares while both ran: up to the first sample where either had finished.
  const overlapEnd = bothSeries.find((s) => s.done.some((d) => d >= TASKS)) ?? bothSeries.at(-1)!;
  const [doneA, doneB] = overlapEnd.done as [number, number];

  const chart = writeSvg(
    path.resolve(import.meta.dirname, 'out', 'batch-progress.svg'),
    lineChartsSvg(`Evaluation batches of ${TASKS} tasks (\`true\`), ${SLOTS} slots`, 'seconds since submit', [
      { title: 'one tenant', yLabel: 'tasks done', series: [{ label: 'eval-a', points: singleSeries.map((s) => ({ x: s.atS, y: s.done[0]! })) }] },
      { title: 'two tenants submitting at once', yLabel: 'tasks done', series: [0, 1].map((i) => ({ label: i === 0 ? 'eval-a' : 'eval-b', points: bothSeries.map((s) => ({ x: s.atS, y: s.done[i]! })) })) },
    ]),
  );
  process.stderr.write(`chart: ${chart}\n`);
  const singlePerSecond = round((TASKS / singleWallMs) * 1000);
  console.log(
    JSON.stringify({
      bench: 'batch',
      tasks: TASKS,
      slots: SLOTS,
      floorPerSecond,
      single: { tasksPerSecond: singlePerSecond, ratioToFloor: round(singlePerSecond / floorPerSecond), firstResultMs, wallMs: round(singleWallMs), redisCallsPerTask, redisCallsPerTaskLessBackground, backgroundCallsPerSecond: round(backgroundPerSecond) },
      twoTenants: {
        tasksPerSecond: round(((2 * TASKS) / bothWallMs) * 1000),
        whileBothRan: { seconds: overlapEnd.atS, doneA, doneB, shareA: round(doneA / (doneA + doneB)), shareB: round(doneB / (doneA + doneB)) },
      },
      chart,
    }),
  );
} finally {
  redis.disconnect();
  await cluster.stop();
}

function round(x: number): number {
  return Math.round(x * 100) / 100;
}

/** Polls the batches until every one has ended; samples of how many tasks each had done, twice a second. */
async function waitBatches(batches: [string, string][], label: string): Promise<{ atS: number; done: number[] }[]> {
  const bar = progressBar(label, { total: 1 });
  const started = performance.now();
  const samples: { atS: number; done: number[] }[] = [];
  for (;;) {
    const now = await Promise.all(batches.map(([token, id]) => api<Batch>(cluster, token, 'GET', `/v1/batches/${id}`).then((r) => r.body)));
    samples.push({ atS: round((performance.now() - started) / 1000), done: now.map(done) });
    const total = now.reduce((s, b) => s + b.counts.total, 0);
    const finished = now.reduce((s, b) => s + done(b), 0);
    bar.update(finished / total, `${finished}/${total}`);
    if (now.every((b) => ['completed', 'cancelled', 'failed', 'expired'].includes(b.state))) {
      bar.done();
      return samples.filter((_, i) => i % 2 === 0 || i === samples.length - 1);
    }
    await new Promise((r) => setTimeout(r, 500));
  }
}
