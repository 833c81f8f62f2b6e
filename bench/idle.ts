/**
 * bench:idle — host memory per idle sandbox: N sandboxes created through the HTTP API, each
 * having run one command (so its init has a keeper, as an agent's sandbox between turns
 * does), then left idle; the host's used memory (MemTotal - MemAvailable) before and after,
 * per sandbox. Target: at most 1.5 MiB. Ends with one JSON line.
 */
import { api, startTestCluster } from '../test/support/cluster.ts';
import { usedMiB } from './support/meminfo.ts';
import { progressBar } from '../src/report/index.ts';

const SANDBOXES = Number(process.env.BENCH_SANDBOXES ?? 300);
const CONCURRENCY = 4;

const settle = () => new Promise((r) => setTimeout(r, 3000));

const cluster = await startTestCluster({
  // Admission would stop at the host's memory; idle agents are what DSec oversubscribes.
  workers: [{ nodeId: 'bench-node', env: { ROLLBOX_NODE_MAX_SANDBOXES: String(SANDBOXES + 10), ROLLBOX_NODE_MEMORY_MIB: String((SANDBOXES + 10) * 64) } }],
  env: { ROLLBOX_HEARTBEAT_MS: '1000', ROLLBOX_NODE_LOST_AFTER_MS: '5000', ROLLBOX_TENANT_MAX_SANDBOXES: String(SANDBOXES + 10) },
});
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));
const ids: string[] = [];
const token = await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec']);
try {
  const one = async () => {
    const r = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64, cpuMillis: 10, diskMiB: 64 } });
    if (r.status !== 201) throw new Error(`create failed: ${r.status} ${JSON.stringify(r.body)}`);
    ids.push(r.body.id);
    const e = await api(cluster, token, 'POST', `/v1/sandboxes/${r.body.id}/exec`, { cmd: 'echo ready > /root/state' });
    if (e.status !== 200) throw new Error(`exec failed: ${JSON.stringify(e.body)}`);
  };
  await one(); // the base layer mounted, the scratch filesystem made, code warm
  await settle();
  const before = usedMiB();
  const bar = progressBar('idle sandboxes', { total: SANDBOXES });
  let next = 0;
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < SANDBOXES) {
        next++;
        await one();
        bar.tick();
      }
    }),
  );
  bar.done();
  await settle();
  const after = usedMiB();
  const perSandboxMiB = Math.round(((after - before) / SANDBOXES) * 100) / 100;
  console.log(JSON.stringify({ bench: 'idle', sandboxes: SANDBOXES, usedBeforeMiB: Math.round(before), usedAfterMiB: Math.round(after), perSandboxMiB, targets: { perSandboxMiB: 1.5 } }));
} finally {
  process.stderr.write(`releasing ${ids.length} sandboxes\n`);
  for (let i = 0; i < ids.length; i += 16) await Promise.all(ids.slice(i, i + 16).map((id) => api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)));
  await cluster.stop();
}
