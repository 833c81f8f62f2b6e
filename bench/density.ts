/**
 * bench:density — N idle sandboxes on one host (default 3,200, DSec's per-node operating
 * point), each having run one command, reserving small requests under larger limits:
 * the host's memory per sandbox (MemTotal - MemAvailable before and after, so the worker's
 * own bookkeeping counts), exec round trips into 20 random ones at that density, and
 * creates and deletes per second. Progress on stderr, a CDF chart in bench/out/, one JSON line.
 */
import path from 'node:path';
import { usedMiB } from './support/meminfo.ts';
import { progressBar, summarize, writeCdfChart } from '../src/report/index.ts';
import { api, startTestCluster } from '../test/support/cluster.ts';
import { timed } from './support/runc-floor.ts';

const SANDBOXES = Number(process.env.BENCH_SANDBOXES ?? 3200);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 8);
const PROBES = 20;
/** Limits an agent may use; requests are what it reserves while it mostly sits idle. */
const RESOURCES = { memoryMiB: 256, cpuMillis: 100, diskMiB: 64, requests: { memoryMiB: 4, cpuMillis: 2 } };

const settle = () => new Promise((r) => setTimeout(r, 5000));

const cluster = await startTestCluster({
  workers: [{ nodeId: 'bench-density', env: { ROLLBOX_NODE_MAX_SANDBOXES: String(SANDBOXES + 10) } }],
  env: { ROLLBOX_HEARTBEAT_MS: '1000', ROLLBOX_NODE_LOST_AFTER_MS: '10000', ROLLBOX_TENANT_MAX_SANDBOXES: String(SANDBOXES + 10) },
});
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));
const ids: string[] = [];
const token = await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec']);
/** `count` tasks, CONCURRENCY at a time, with a progress bar; the wall time. */
async function inParallel(label: string, count: number, task: (i: number) => Promise<void>): Promise<number> {
  const bar = progressBar(label, { total: count });
  let next = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < count) {
        await task(next++);
        bar.tick();
      }
    }),
  );
  bar.done();
  return performance.now() - started;
}
const exec = async (id: string, cmd: string) => {
  const e = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd });
  if (e.status !== 200 || e.body.exitCode !== 0) throw new Error(`exec failed: ${e.status} ${JSON.stringify(e.body)}`);
};
const create = async () => {
  const r = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: RESOURCES });
  if (r.status !== 201) throw new Error(`create ${ids.length + 1} failed: ${r.status} ${JSON.stringify(r.body)}`);
  ids.push(r.body.id);
  await exec(r.body.id, 'echo ready > /root/state');
};

try {
  await create(); // the base layer mounted, the scratch filesystem made, code warm
  await settle();
  const before = usedMiB();
  const createWallMs = await inParallel(`${SANDBOXES} idle sandboxes`, SANDBOXES, create);
  await settle();
  const after = usedMiB();
  const workerRssMiB = Math.round(process.memoryUsage().rss / 1024 / 1024);

  const probes: number[] = [];
  for (let i = 0; i < PROBES * 3; i++) {
    const id = ids[Math.floor(Math.random() * ids.length)]!;
    probes.push(await timed(() => exec(id, 'true')));
  }
  const p = summarize(probes);
  const chart = writeCdfChart(path.resolve(import.meta.dirname, 'out', 'density-exec.svg'), `exec \`true\` into random sandboxes, ${ids.length} live on the host`, [{ label: `${ids.length} idle sandboxes live`, samplesMs: probes }]);

  const toDelete = ids.splice(0);
  const deleteWallMs = await inParallel(`deleting ${toDelete.length}`, toDelete.length, async (i) => {
    const r = await api(cluster, token, 'DELETE', `/v1/sandboxes/${toDelete[i]}`);
    if (r.status !== 200) throw new Error(`delete failed: ${r.status}`);
  });
  process.stderr.write(`chart: ${chart}\n`);
  const rate = (n: number, ms: number) => Math.round((n / ms) * 1000 * 10) / 10;
  console.log(
    JSON.stringify({
      bench: 'density',
      sandboxes: SANDBOXES + 1,
      usedBeforeMiB: Math.round(before),
      usedAfterMiB: Math.round(after),
      perSandboxMiB: Math.round(((after - before) / SANDBOXES) * 100) / 100,
      /** The bench process holds the gateway and the worker host: its RSS is part of the figure above. */
      gatewayAndWorkerRssMiB: workerRssMiB,
      execP50Ms: p.p50Ms,
      execP99Ms: p.p99Ms,
      createsPerSecond: rate(SANDBOXES, createWallMs),
      deletesPerSecond: rate(toDelete.length, deleteWallMs),
      resources: RESOURCES,
      targets: { perSandboxMiB: 2 },
      chart,
    }),
  );
} finally {
  if (ids.length) {
    process.stderr.write(`releasing ${ids.length} sandboxes\n`);
    for (let i = 0; i < ids.length; i += 16) await Promise.all(ids.slice(i, i + 16).map((id) => api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)));
  }
  await cluster.stop();
}
