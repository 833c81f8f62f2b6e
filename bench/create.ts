/**
 * bench:create — sandbox creation through the HTTP API, serially and concurrently, next
 * to raw `runc run -d` of the same rootfs and config measured in the same run, and the
 * Redis calls a create and a delete cost.
 * Prints progress on stderr, writes a CDF chart to bench/out/, ends with one JSON line.
 */
import path from 'node:path';
import { Redis } from 'ioredis';
import { api, startTestCluster } from '../test/support/cluster.ts';
import { callsPerOperation } from './support/redis-calls.ts';
import { rawRuncRunFloor, timed } from './support/runc-floor.ts';
import { progressBar, summarize, writeCdfChart } from '../src/report/index.ts';

const SERIAL = Number(process.env.BENCH_SERIAL ?? 60);
const CONCURRENT = Number(process.env.BENCH_CONCURRENT ?? 150);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 8);
const FLOOR = Number(process.env.BENCH_FLOOR ?? 60);

const cluster = await startTestCluster({
  workers: [{ nodeId: 'bench-node', env: { ROLLBOX_NODE_MAX_STARTING: String(CONCURRENCY * 2) } }],
  env: { ROLLBOX_HEARTBEAT_MS: '1000', ROLLBOX_NODE_LOST_AFTER_MS: '5000' },
});
const redis = new Redis(cluster.redisUrl);
// Ctrl-C still removes every container, mount and process the bench started.
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));
try {
  const token = await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec']);
  const body = { resources: { memoryMiB: 64, cpuMillis: 100, diskMiB: Number(process.env.BENCH_DISK_MIB ?? 1024) } };
  const created: string[] = [];
  const create = async () => {
    const r = await api(cluster, token, 'POST', '/v1/sandboxes', body);
    if (r.status !== 201) throw new Error(`create failed: ${r.status} ${JSON.stringify(r.body)}`);
    created.push(r.body.id);
  };
  const releaseAll = async () => {
    const ids = created.splice(0);
    for (let i = 0; i < ids.length; i += 16) await Promise.all(ids.slice(i, i + 16).map((id) => api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)));
  };

  for (let i = 0; i < 5; i++) await create(); // warm-up: layer mount, JIT, connections
  const template = created[0]!;

  const serialBar = progressBar('serial creates', { total: SERIAL });
  const serial: number[] = [];
  for (let i = 0; i < SERIAL; i++) {
    serial.push(await timed(create));
    serialBar.tick();
  }
  serialBar.done();

  const workerDir = path.join(cluster.rootDir, 'bench-node', 'worker');
  const floorBar = progressBar('raw runc run -d (floor)', { total: FLOOR });
  const floor = (await rawRuncRunFloor({ workerDir, templateSandboxId: template, runs: FLOOR, onRun: floorBar.tick })).samplesMs;
  floorBar.done();
  const floorConcurrentBar = progressBar(`raw runc run -d (x${CONCURRENCY})`, { total: FLOOR });
  const floorConcurrent = await rawRuncRunFloor({ workerDir, templateSandboxId: template, runs: FLOOR, concurrency: CONCURRENCY, onRun: floorConcurrentBar.tick });
  floorConcurrentBar.done();
  await releaseAll();

  const concurrentBar = progressBar(`concurrent creates (x${CONCURRENCY})`, { total: CONCURRENT });
  const concurrent: number[] = [];
  let next = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < CONCURRENT) {
        next++;
        concurrent.push(await timed(create));
        concurrentBar.tick();
      }
    }),
  );
  const wallMs = performance.now() - started;
  concurrentBar.done();
  await releaseAll();

  process.stderr.write('redis calls per create and per delete...\n');
  const redisCallsPerCreate = await callsPerOperation(redis, 20, create);
  const toDelete = created.splice(0);
  const redisCallsPerDelete = await callsPerOperation(redis, toDelete.length, () => api(cluster, token, 'DELETE', `/v1/sandboxes/${toDelete.pop()}`));

  const s = summarize(serial);
  const f = summarize(floor);
  const c = summarize(concurrent);
  const chart = writeCdfChart(path.resolve(import.meta.dirname, 'out', 'create-latency.svg'), 'sandbox create latency', [
    { label: 'rollbox create, serial (HTTP)', samplesMs: serial },
    { label: `rollbox create, ${CONCURRENCY} concurrent (HTTP)`, samplesMs: concurrent },
    { label: 'raw runc run -d (floor)', samplesMs: floor },
  ]);
  process.stderr.write(`chart: ${chart}\n`);
  const result = {
    bench: 'create',
    p50Ms: s.p50Ms,
    p99Ms: s.p99Ms,
    floorP50Ms: f.p50Ms,
    floorP99Ms: f.p99Ms,
    ratioP50: Math.round((s.p50Ms / f.p50Ms) * 100) / 100,
    perSecond: Math.round((CONCURRENT / wallMs) * 1000 * 10) / 10,
    /** Raw `runc run -d` at the same concurrency: the most this machine can start per second. */
    floorPerSecond: Math.round((FLOOR / floorConcurrent.wallMs) * 1000 * 10) / 10,
    concurrency: CONCURRENCY,
    concurrentP50Ms: c.p50Ms,
    concurrentP99Ms: c.p99Ms,
    redisCallsPerCreate,
    redisCallsPerDelete,
    serialN: s.n,
    concurrentN: c.n,
    targets: { ratioP50: 1.5, perSecond: 30, redisCallsPerCreate: 40 },
    chart,
  };
  console.log(JSON.stringify(result));
} finally {
  redis.disconnect();
  await cluster.stop();
}
