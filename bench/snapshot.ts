/**
 * bench:snapshot — pack_diff through the HTTP API against the size of the writable layer,
 * and the create of a sandbox restored from the snapshot next to a create from the base
 * alone, in the same run. Ends with one JSON line.
 */
import { api, startTestCluster } from '../test/support/cluster.ts';
import { timed } from './support/runc-floor.ts';
import { progressBar, summarize } from '../src/report/index.ts';

const SIZES_MIB = (process.env.BENCH_SNAPSHOT_MIB ?? '0,16,64').split(',').map(Number);
const RUNS = Number(process.env.BENCH_RUNS ?? 5);

const cluster = await startTestCluster({ workers: [{ nodeId: 'bench-node' }] });
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));
try {
  const token = await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec', 'sandbox:snapshot']);
  const call = async (method: string, path: string, body?: unknown) => {
    const r = await api(cluster, token, method, path, body);
    if (r.status >= 300) throw new Error(`${method} ${path}: ${r.status} ${JSON.stringify(r.body)}`);
    return r.body;
  };
  const rows: { writableMiB: number; snapshotP50Ms: number; snapshotP99Ms: number; restoreCreateP50Ms: number; baseCreateP50Ms: number }[] = [];
  const bar = progressBar('snapshot + restore', { total: SIZES_MIB.length * RUNS });
  for (const mib of SIZES_MIB) {
    const snapshots: number[] = [];
    const restores: number[] = [];
    const bases: number[] = [];
    for (let i = 0; i < RUNS; i++) {
      const build = await call('POST', '/v1/sandboxes', { resources: { memoryMiB: 256 } });
      await call('POST', `/v1/sandboxes/${build.id}/exec`, { cmd: `head -c ${mib * 1024 * 1024} /dev/urandom > /root/blob; echo $RANDOM > /root/nonce`, timeoutMs: 120_000 });
      let layer: { digest: string } | undefined;
      snapshots.push(await timed(async () => (layer = await call('POST', `/v1/sandboxes/${build.id}/snapshot`, {}))));
      let restored: { id: string } | undefined;
      restores.push(await timed(async () => (restored = await call('POST', '/v1/sandboxes', { image: { base: 'busybox', layers: [layer!.digest] } }))));
      let base: { id: string } | undefined;
      bases.push(await timed(async () => (base = await call('POST', '/v1/sandboxes', {}))));
      for (const id of [build.id, restored!.id, base!.id]) await call('DELETE', `/v1/sandboxes/${id}`);
      bar.tick();
    }
    rows.push({ writableMiB: mib, snapshotP50Ms: summarize(snapshots).p50Ms, snapshotP99Ms: summarize(snapshots).p99Ms, restoreCreateP50Ms: summarize(restores).p50Ms, baseCreateP50Ms: summarize(bases).p50Ms });
  }
  bar.done();
  const first = rows[0]!;
  console.log(
    JSON.stringify({
      bench: 'snapshot',
      p50Ms: first.snapshotP50Ms,
      p99Ms: first.snapshotP99Ms,
      floorP50Ms: first.baseCreateP50Ms,
      ratioP50: Math.round((first.restoreCreateP50Ms / first.baseCreateP50Ms) * 100) / 100,
      perSecond: Math.round((1000 / first.snapshotP50Ms) * 10) / 10,
      note: 'p50Ms = snapshot of the smallest writable layer; ratioP50 = create from the snapshot / create from the base alone',
      rows,
      reference: { cubeSandboxSnapshotMs: 46, cubeSandboxResumeMs: 42 },
    }),
  );
} finally {
  await cluster.stop();
}
