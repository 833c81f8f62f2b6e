/**
 * bench:files — the files API through HTTP: write then read a 4 KiB file (the target: at
 * most 15 ms each at p50), and the same for 1 MiB; prints progress on stderr, writes a CDF
 * chart to bench/out/, ends with one JSON line.
 */
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { api, startTestCluster } from '../test/support/cluster.ts';
import { timed } from './support/runc-floor.ts';
import { progressBar, summarize, writeCdfChart } from '../src/report/index.ts';

const RUNS = Number(process.env.BENCH_RUNS ?? 200);
const BIG_RUNS = Number(process.env.BENCH_BIG_RUNS ?? 30);

const cluster = await startTestCluster({ workers: [{ nodeId: 'bench-node' }], env: { ROLLBOX_HEARTBEAT_MS: '1000', ROLLBOX_NODE_LOST_AFTER_MS: '5000' } });
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));
try {
  const token = await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec', 'sandbox:read']);
  const created = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 128 } });
  if (created.status !== 201) throw new Error(`create failed: ${JSON.stringify(created.body)}`);
  const id = created.body.id as string;
  const url = (p: string) => `${cluster.url}/v1/sandboxes/${id}/files?path=${encodeURIComponent(p)}`;
  const headers = { authorization: `Bearer ${token}` };
  const write = async (p: string, bytes: Buffer) => {
    const r = await fetch(url(p), { method: 'PUT', headers, body: new Uint8Array(bytes) });
    if (r.status !== 200) throw new Error(`write failed: ${r.status} ${await r.text()}`);
    await r.arrayBuffer();
  };
  const read = async (p: string, expected: Buffer) => {
    const r = await fetch(url(p), { headers });
    const body = Buffer.from(await r.arrayBuffer());
    if (r.status !== 200 || !body.equals(expected)) throw new Error(`read failed: ${r.status} (${body.length} bytes)`);
  };
  const measure = async (label: string, sizeBytes: number, runs: number) => {
    const bar = progressBar(label, { total: runs * 2 });
    const writes: number[] = [];
    const reads: number[] = [];
    for (let i = 0; i < runs; i++) {
      const bytes = randomBytes(sizeBytes);
      const p = `/root/files/f${i % 16}.bin`;
      writes.push(await timed(() => write(p, bytes)));
      bar.tick();
      reads.push(await timed(() => read(p, bytes)));
      bar.tick();
    }
    bar.done();
    return { writes, reads };
  };
  const warm = randomBytes(4096);
  for (let i = 0; i < 10; i++) {
    await write('/root/warm.bin', warm);
    await read('/root/warm.bin', warm);
  }
  const small = await measure('4 KiB write + read', 4096, RUNS);
  const big = await measure('1 MiB write + read', 1024 * 1024, BIG_RUNS);
  await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);

  const chart = writeCdfChart(path.resolve(import.meta.dirname, 'out', 'files-latency.svg'), 'files API round trip', [
    { label: 'write 4 KiB', samplesMs: small.writes },
    { label: 'read 4 KiB', samplesMs: small.reads },
    { label: 'write 1 MiB', samplesMs: big.writes },
    { label: 'read 1 MiB', samplesMs: big.reads },
  ]);
  process.stderr.write(`chart: ${chart}\n`);
  const [w, r, bw, br] = [small.writes, small.reads, big.writes, big.reads].map(summarize);
  console.log(
    JSON.stringify({
      bench: 'files',
      write4KiBP50Ms: w!.p50Ms,
      write4KiBP99Ms: w!.p99Ms,
      read4KiBP50Ms: r!.p50Ms,
      read4KiBP99Ms: r!.p99Ms,
      write1MiBP50Ms: bw!.p50Ms,
      read1MiBP50Ms: br!.p50Ms,
      n: w!.n,
      targets: { write4KiBP50Ms: 15, read4KiBP50Ms: 15 },
      chart,
    }),
  );
} finally {
  await cluster.stop();
}
