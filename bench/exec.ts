/**
 * bench:exec — one command's round trip through the HTTP API (plain exec of `true`), next
 * to raw `runc exec` of the same command in the same container measured in the same run;
 * the same paced like an agent's turns, in a sandbox of 1000 and one of 10 millicores
 * (`smallQuotaRatio`); where the milliseconds go, hop by hop
 * (the gateway's Server-Timing); and the Redis calls an exec costs, and an idle worker host
 * per second. Prints progress on stderr, writes a CDF chart to bench/out/, ends with one
 * JSON line.
 */
import path from 'node:path';
import { Redis } from 'ioredis';
import { api, startTestCluster } from '../test/support/cluster.ts';
import { backgroundCallsPerSecond, callsPerOperation } from './support/redis-calls.ts';
import { rawRuncExecFloor, timed } from './support/runc-floor.ts';
import { progressBar, summarize, writeCdfChart } from '../src/report/index.ts';

const RUNS = Number(process.env.BENCH_RUNS ?? 300);
const PACED_RUNS = Number(process.env.BENCH_PACED_RUNS ?? 60);
/**
 * The pause between paced execs: an agent's model thinks between turns (seconds, in RL),
 * and a sandbox on a small CPU quota gets its quota back while it waits. 250 ms is 2.5 CFS
 * periods: enough for the quota (and its burst) to refill.
 */
const THINK_MS = Number(process.env.BENCH_THINK_MS ?? 250);
const FLOOR_RUNS = Number(process.env.BENCH_FLOOR_RUNS ?? 100);
const ARGV = ['true'];

// Heartbeats at the production default: the background Redis rate is then a real one.
const cluster = await startTestCluster({ workers: [{ nodeId: 'bench-node' }], env: { ROLLBOX_HEARTBEAT_MS: '1000', ROLLBOX_NODE_LOST_AFTER_MS: '5000' } });
const redis = new Redis(cluster.redisUrl);
// Ctrl-C still removes every container, mount and process the bench started.
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));
try {
  const token = await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec']);
  const createSandbox = async (cpuMillis: number) => {
    const r = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64, cpuMillis } });
    if (r.status !== 201) throw new Error(`create failed: ${r.status} ${JSON.stringify(r.body)}`);
    return r.body.id as string;
  };
  const hops = new Map<string, number[]>();
  const exec = async (id: string) => {
    const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { argv: ARGV });
    if (r.status !== 200 || r.body.exitCode !== 0) throw new Error(`exec failed: ${r.status} ${JSON.stringify(r.body)}`);
    for (const entry of (r.headers.get('server-timing') ?? '').split(',')) {
      const m = /^([a-z]+);dur=([\d.]+)/.exec(entry.trim());
      if (m) hops.set(m[1]!, [...(hops.get(m[1]!) ?? []), Number(m[2])]);
    }
  };
  const sample = async (label: string, id: string, runs: number, thinkMs = 0) => {
    const bar = progressBar(label, { total: runs });
    const samples: number[] = [];
    for (let i = 0; i < runs; i++) {
      if (thinkMs) await new Promise((r) => setTimeout(r, thinkMs));
      samples.push(await timed(() => exec(id)));
      bar.tick();
    }
    bar.done();
    return samples;
  };

  const sandbox = await createSandbox(1000);
  for (let i = 0; i < 20; i++) await exec(sandbox);
  hops.clear();
  const samples = await sample('exec via HTTP', sandbox, RUNS);
  const hopMedians = Object.fromEntries([...hops].map(([hop, ms]) => [hop, summarize(ms).p50Ms]));
  const paced = await sample(`exec, ${THINK_MS} ms apart`, sandbox, PACED_RUNS, THINK_MS);
  const small = await createSandbox(10);
  for (let i = 0; i < 5; i++) await exec(small);
  const smallSamples = await sample(`exec, cpuMillis 10, ${THINK_MS} ms apart`, small, PACED_RUNS, THINK_MS);
  const smallBackToBack = await sample('exec, cpuMillis 10, back to back', small, 30);

  process.stderr.write('redis calls per exec...\n');
  const redisCallsPerExec = await callsPerOperation(redis, 100, () => exec(sandbox));
  const oneWorker = await backgroundCallsPerSecond(redis);
  await cluster.addWorker({ nodeId: 'bench-idle', env: { ROLLBOX_HEARTBEAT_MS: '1000' } });
  const twoWorkers = await backgroundCallsPerSecond(redis);

  const floorBar = progressBar('raw runc exec (floor)', { total: FLOOR_RUNS });
  const floor = await rawRuncExecFloor({ workerDir: path.join(cluster.rootDir, 'bench-node', 'worker'), sandboxId: sandbox, argv: ARGV, runs: FLOOR_RUNS, onRun: floorBar.tick });
  floorBar.done();
  await Promise.all([sandbox, small].map((id) => api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)));

  const s = summarize(samples);
  const p = summarize(paced);
  const q = summarize(smallSamples);
  const qb = summarize(smallBackToBack);
  const f = summarize(floor);
  const chart = writeCdfChart(path.resolve(import.meta.dirname, 'out', 'exec-latency.svg'), 'exec round trip', [
    { label: 'rollbox exec (HTTP)', samplesMs: samples },
    { label: `rollbox exec, ${THINK_MS} ms apart (HTTP)`, samplesMs: paced },
    { label: `rollbox exec, cpuMillis 10, ${THINK_MS} ms apart (HTTP)`, samplesMs: smallSamples },
    { label: 'raw runc exec (floor)', samplesMs: floor },
  ]);
  process.stderr.write(`chart: ${chart}\n`);
  console.log(
    JSON.stringify({
      bench: 'exec',
      p50Ms: s.p50Ms,
      p99Ms: s.p99Ms,
      floorP50Ms: f.p50Ms,
      floorP99Ms: f.p99Ms,
      ratioP50: Math.round((s.p50Ms / f.p50Ms) * 100) / 100,
      /** Execs THINK_MS apart (an agent's turns): the same sandbox, then one at cpuMillis 10. */
      pacedP50Ms: p.p50Ms,
      smallQuotaP50Ms: q.p50Ms,
      smallQuotaP99Ms: q.p99Ms,
      smallQuotaRatio: Math.round((q.p50Ms / p.p50Ms) * 100) / 100,
      /** At cpuMillis 10 with no pause, each exec's ~1.5 ms of CPU waits for the next 100 ms period. */
      smallQuotaBackToBackP50Ms: qb.p50Ms,
      thinkMs: THINK_MS,
      /** Median milliseconds per hop (Server-Timing): auth, lookup, claim, dispatch, worker, run, total. */
      hopsP50Ms: hopMedians,
      perSecond: Math.round((1000 / s.meanMs) * 10) / 10,
      redisCallsPerExec,
      redisCallsPerSecondPerIdleWorker: Math.round((twoWorkers - oneWorker) * 10) / 10,
      n: s.n,
      targets: { p50Ms: 10, smallQuotaRatio: 1.5, redisCallsPerExec: 20 },
      chart,
    }),
  );
} finally {
  redis.disconnect();
  await cluster.stop();
}
