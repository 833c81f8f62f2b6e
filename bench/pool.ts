/**
 * bench:pool — a burst of creates against a warm pool of the same size, then the same
 * burst cold (no pool) in the same run: creates per second and the latency distribution
 * of each. Prints progress on stderr, writes a CDF chart to bench/out/, ends with one JSON line.
 */
import path from 'node:path';
import { api, startTestCluster, waitFor } from '../test/support/cluster.ts';
import type { NodeHeartbeat } from '../src/api/index.ts';
import { progressBar, summarize, writeCdfChart } from '../src/report/index.ts';
import { timed } from './support/runc-floor.ts';

const BURST = Number(process.env.BENCH_BURST ?? 200);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 32);
/** Creates one at a time, for the latency of one create on a quiet host. */
const SERIAL = Number(process.env.BENCH_SERIAL ?? 40);
const NODE = 'bench-pool';

const cluster = await startTestCluster({
  workers: [{ nodeId: NODE, env: { ROLLBOX_NODE_MAX_STARTING: String(CONCURRENCY), ROLLBOX_POOL_REFILL_CONCURRENCY: '4', ROLLBOX_NODE_MAX_SANDBOXES: String(BURST * 3) } }],
  env: { ROLLBOX_HEARTBEAT_MS: '500', ROLLBOX_NODE_LOST_AFTER_MS: '5000' },
});
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));
try {
  const admin = await cluster.token('ops', ['admin']);
  const token = await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec']);
  const body = { resources: { memoryMiB: 16, cpuMillis: 50, diskMiB: 64 } };
  const readyNow = async () => (await api<{ nodes: NodeHeartbeat[] }>(cluster, admin, 'GET', '/v1/nodes')).body.nodes.find((n) => n.nodeId === NODE && n.healthy)?.pools?.bench?.ready ?? 0;

  /** `count` creates, `concurrency` at a time: latencies, wall time, how many came from the pool. */
  const burst = async (label: string, count = BURST, concurrency = CONCURRENCY) => {
    const bar = progressBar(label, { total: count });
    const samples: number[] = [];
    const ids: string[] = [];
    let pooled = 0;
    let next = 0;
    const started = performance.now();
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        while (next < count) {
          next++;
          samples.push(
            await timed(async () => {
              const r = await api(cluster, token, 'POST', '/v1/sandboxes', body);
              if (r.status !== 201) throw new Error(`create failed: ${r.status} ${JSON.stringify(r.body)}`);
              ids.push(r.body.id);
              if (r.body.pool) pooled++;
            }),
          );
          bar.tick();
        }
      }),
    );
    const wallMs = performance.now() - started;
    bar.done();
    // Every sandbox answers (a claimed one is a real, bound sandbox).
    const probe = await api(cluster, token, 'POST', `/v1/sandboxes/${ids[0]}/exec`, { cmd: 'echo ok' });
    if (probe.body.stdout !== 'ok\n') throw new Error(`exec after the burst failed: ${JSON.stringify(probe.body)}`);
    const releaseBar = progressBar('releasing', { total: ids.length });
    for (let i = 0; i < ids.length; i += 16) {
      await Promise.all(ids.slice(i, i + 16).map((id) => api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)));
      releaseBar.update(Math.min(1, (i + 16) / ids.length), `${Math.min(ids.length, i + 16)}/${ids.length}`);
    }
    releaseBar.done();
    return { samples, wallMs, pooled };
  };

  // Warm-up: layer mount, JIT, connections.
  for (let i = 0; i < 3; i++) await api(cluster, token, 'DELETE', `/v1/sandboxes/${(await api(cluster, token, 'POST', '/v1/sandboxes', body)).body.id}`);

  const put = await api(cluster, admin, 'PUT', '/v1/pools/bench', { size: BURST, diskMiB: 64, resources: { memoryMiB: 16, cpuMillis: 50, pids: 256 } });
  if (put.status !== 200) throw new Error(`pool: ${put.status} ${JSON.stringify(put.body)}`);
  const fillBar = progressBar(`filling the pool to ${BURST}`, { total: BURST });
  const fillStarted = performance.now();
  const full = () =>
    waitFor('the pool full', async () => {
      const ready = await readyNow();
      fillBar.update(ready / BURST, `${ready}/${BURST}`);
      return ready >= BURST;
    }, 30 * 60_000);
  await full();
  const fillMs = performance.now() - fillStarted;
  fillBar.done();

  const serialFromPool = await burst(`${SERIAL} one at a time from the pool`, SERIAL, 1);
  await full();
  const fromPool = await burst(`burst of ${BURST} from the pool (x${CONCURRENCY})`);
  if ((await api(cluster, admin, 'DELETE', '/v1/pools/bench')).status !== 204) throw new Error('pool delete failed');
  await waitFor('the pool emptied', async () => (await api<{ nodes: NodeHeartbeat[] }>(cluster, admin, 'GET', '/v1/nodes')).body.nodes.find((n) => n.nodeId === NODE)?.sandboxes === 0, 5 * 60_000);
  const serialCold = await burst(`${SERIAL} one at a time cold`, SERIAL, 1);
  const cold = await burst(`burst of ${BURST} cold (x${CONCURRENCY})`);

  const p = summarize(fromPool.samples);
  const c = summarize(cold.samples);
  const sp = summarize(serialFromPool.samples);
  const sc = summarize(serialCold.samples);
  const chart = writeCdfChart(path.resolve(import.meta.dirname, 'out', 'pool-burst.svg'), `a burst of ${BURST} creates, ${CONCURRENCY} at a time`, [
    { label: `burst from a warm pool (x${CONCURRENCY})`, samplesMs: fromPool.samples },
    { label: `burst cold (x${CONCURRENCY})`, samplesMs: cold.samples },
    { label: 'one at a time from a warm pool', samplesMs: serialFromPool.samples },
    { label: 'one at a time cold', samplesMs: serialCold.samples },
  ]);
  process.stderr.write(`chart: ${chart}\n`);
  const perSecond = (n: number, ms: number) => Math.round((n / ms) * 1000 * 10) / 10;
  console.log(
    JSON.stringify({
      bench: 'pool',
      burst: BURST,
      concurrency: CONCURRENCY,
      fromPool: { perSecond: perSecond(BURST, fromPool.wallMs), p50Ms: p.p50Ms, p99Ms: p.p99Ms, pooled: fromPool.pooled },
      cold: { perSecond: perSecond(BURST, cold.wallMs), p50Ms: c.p50Ms, p99Ms: c.p99Ms },
      speedup: Math.round((perSecond(BURST, fromPool.wallMs) / perSecond(BURST, cold.wallMs)) * 10) / 10,
      /** One create at a time: the latency a single claim costs, against a cold start measured the same way. */
      serial: { fromPoolP50Ms: sp.p50Ms, fromPoolP99Ms: sp.p99Ms, coldP50Ms: sc.p50Ms, coldP99Ms: sc.p99Ms, ratioP50: Math.round((sp.p50Ms / sc.p50Ms) * 100) / 100 },
      refillPerSecond: perSecond(BURST, fillMs),
      targets: { perSecond: 150, serialFromPoolP50Ms: 15 },
      chart,
    }),
  );
} finally {
  await cluster.stop();
}
