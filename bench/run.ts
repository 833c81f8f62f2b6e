/**
 * bench:run — sustained POST /v1/run calls per second of a short command (`true`), cold
 * and from a warm pool (while it lasts), beside the floor of the same run: raw `runc run -d`
 * + `runc delete -f` of the same rootfs and config, at the same concurrency. Prints progress
 * on stderr, writes a CDF chart to bench/out/, ends with one JSON line.
 */
import path from 'node:path';
import type { NodeHeartbeat, RunResult } from '../src/api/index.ts';
import { progressBar, summarize, writeCdfChart } from '../src/report/index.ts';
import { api, startTestCluster, waitFor } from '../test/support/cluster.ts';
import { jsonClient } from './support/http.ts';
import { rawRuncRunFloor, timed } from './support/runc-floor.ts';

const CALLS = Number(process.env.BENCH_CALLS ?? 200);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 8);
const POOL = Number(process.env.BENCH_POOL ?? 100);
const NODE = 'bench-run';

const cluster = await startTestCluster({
  workers: [{ nodeId: NODE, env: { ROLLBOX_NODE_MAX_STARTING: String(CONCURRENCY * 2), ROLLBOX_POOL_REFILL_CONCURRENCY: '4' } }],
  env: { ROLLBOX_HEARTBEAT_MS: '500', ROLLBOX_NODE_LOST_AFTER_MS: '5000' },
});
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));
try {
  const admin = await cluster.token('ops', ['admin']);
  const token = await cluster.token('bench', ['sandbox:run', 'sandbox:create', 'sandbox:delete']);
  const body = { cmd: 'true', resources: { memoryMiB: 32, cpuMillis: 100, diskMiB: 64 } };
  // The caller as in the other throughput benches: keep-alive node:http (it shares the 2 cores with the stack; fetch costs it twice the CPU).
  const call = jsonClient(cluster.url, token);

  /** `count` calls, CONCURRENCY at a time: latencies, wall time, how many came from the pool. */
  const calls = async (label: string, count: number) => {
    const bar = progressBar(label, { total: count });
    const samples: number[] = [];
    let pooled = 0;
    let next = 0;
    const started = performance.now();
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (next < count) {
          next++;
          samples.push(
            await timed(async () => {
              const r = (await call('POST', '/v1/run', body)) as { status: number; body: RunResult };
              if (r.status !== 200 || r.body.status !== 'ok') throw new Error(`run failed: ${r.status} ${JSON.stringify(r.body)}`);
              if (r.body.pool) pooled++;
            }),
          );
          bar.tick();
        }
      }),
    );
    const wallMs = performance.now() - started;
    bar.done();
    return { samples, wallMs, pooled, perSecond: Math.round((count / wallMs) * 1000 * 10) / 10 };
  };

  await calls('warm-up', 5);
  // The floor: a template sandbox's own config, started and deleted by runc alone.
  const template = (await api(cluster, token, 'POST', '/v1/sandboxes', { resources: body.resources })).body.id as string;
  const floorBar = progressBar(`raw runc run + delete (x${CONCURRENCY})`, { total: CALLS });
  const floor = await rawRuncRunFloor({ workerDir: path.join(cluster.rootDir, NODE, 'worker'), templateSandboxId: template, runs: CALLS, concurrency: CONCURRENCY, deleteEach: true, onRun: floorBar.tick });
  floorBar.done();
  await api(cluster, token, 'DELETE', `/v1/sandboxes/${template}`);
  const floorPerSecond = Math.round((CALLS / floor.wallMs) * 1000 * 10) / 10;

  const cold = await calls(`${CALLS} runs cold (x${CONCURRENCY})`, CALLS);

  if ((await api(cluster, admin, 'PUT', '/v1/pools/fn', { size: POOL, diskMiB: 64, resources: { memoryMiB: 32, cpuMillis: 100 } })).status !== 200) throw new Error('pool put failed');
  const fillBar = progressBar(`filling the pool to ${POOL}`, { total: POOL });
  await waitFor('the pool full', async () => {
    const ready = (await api<{ nodes: NodeHeartbeat[] }>(cluster, admin, 'GET', '/v1/nodes')).body.nodes.find((n) => n.nodeId === NODE && n.healthy)?.pools?.fn?.ready ?? 0;
    fillBar.update(ready / POOL, `${ready}/${POOL}`);
    return ready >= POOL;
  }, 30 * 60_000);
  fillBar.done();
  const whileItLasts = await calls(`${POOL} runs from the pool (x${CONCURRENCY})`, POOL);
  // Past the pool: claims of what the refill makes, and cold starts beside them.
  const sustained = await calls(`${CALLS} runs with the pool refilling (x${CONCURRENCY})`, CALLS);
  await api(cluster, admin, 'DELETE', '/v1/pools/fn');

  const chart = writeCdfChart(path.resolve(import.meta.dirname, 'out', 'run-latency.svg'), `POST /v1/run of \`true\`, ${CONCURRENCY} at a time`, [
    { label: 'cold', samplesMs: cold.samples },
    { label: 'from a full warm pool', samplesMs: whileItLasts.samples },
    { label: 'pool refilling meanwhile', samplesMs: sustained.samples },
    { label: 'raw runc run + delete (floor)', samplesMs: floor.samplesMs },
  ]);
  process.stderr.write(`chart: ${chart}\n`);
  const ratio = (rate: number) => Math.round((rate / floorPerSecond) * 100) / 100;
  console.log(
    JSON.stringify({
      bench: 'run',
      concurrency: CONCURRENCY,
      floorPerSecond,
      cold: { perSecond: cold.perSecond, ratioToFloor: ratio(cold.perSecond), p50Ms: summarize(cold.samples).p50Ms, p99Ms: summarize(cold.samples).p99Ms },
      pool: { perSecond: whileItLasts.perSecond, ratioToFloor: ratio(whileItLasts.perSecond), p50Ms: summarize(whileItLasts.samples).p50Ms, pooled: whileItLasts.pooled },
      sustainedWithPool: { perSecond: sustained.perSecond, ratioToFloor: ratio(sustained.perSecond), pooled: sustained.pooled },
      floorP50Ms: summarize(floor.samplesMs).p50Ms,
      targets: { coldRatioToFloor: 0.85 },
      chart,
    }),
  );
} finally {
  await cluster.stop();
}
