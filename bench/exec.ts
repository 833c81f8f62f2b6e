/**
 * bench:exec — exec round trip through the HTTP API next to raw `runc exec` of the same
 * command in the same container, measured in the same run. Ends with one JSON line.
 */
import path from 'node:path';
import { api, startTestCluster } from '../test/support/cluster.ts';
import { writeCdfChart } from './support/chart.ts';
import { rawRuncExecFloor, timed } from './support/runc-floor.ts';
import { progress, summarize } from './support/stats.ts';

const RUNS = Number(process.env.BENCH_RUNS ?? 200);
const ARGV = ['true'];

const cluster = await startTestCluster({ workers: [{ nodeId: 'bench-node' }] });
// Ctrl-C still removes every container, mount and process the bench started.
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));
try {
  const token = await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec']);
  const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 } });
  const exec = async () => {
    const r = await api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/exec`, { argv: ARGV });
    if (r.status !== 200 || r.body.exitCode !== 0) throw new Error(`exec failed: ${r.status} ${JSON.stringify(r.body)}`);
  };
  for (let i = 0; i < 10; i++) await exec();

  const bar = progress('exec via HTTP', RUNS);
  const samples: number[] = [];
  for (let i = 0; i < RUNS; i++) {
    samples.push(await timed(exec));
    bar.tick();
  }
  bar.done();
  const floorBar = progress('raw runc exec (floor)', RUNS);
  const floor = await rawRuncExecFloor({ workerDir: path.join(cluster.rootDir, 'bench-node', 'worker'), sandboxId: sandbox.id, argv: ARGV, runs: RUNS, onRun: floorBar.tick });
  floorBar.done();
  await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandbox.id}`);

  const s = summarize(samples);
  const f = summarize(floor);
  const chart = writeCdfChart(path.resolve(import.meta.dirname, 'out', 'exec-latency.svg'), 'exec round trip', [
    { label: 'rollbox exec (HTTP)', samplesMs: samples },
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
      perSecond: Math.round((1000 / s.meanMs) * 10) / 10,
      n: s.n,
      targets: { ratioP50: 1.5 },
      chart,
    }),
  );
} finally {
  await cluster.stop();
}
