/**
 * bench:python-client — 64 concurrent rollouts x 20 turns through the Python async client
 * (clients/python/bench/rollouts.py), beside the same load through plain httpx from the
 * same process: exec p50/p99 of each and the client's overhead per call (latency and CPU).
 * The stack is this process (gateway) plus a worker host of its own; progress on stderr, a
 * CDF chart in bench/out/, one JSON line last.
 */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { writeCdfChart } from '../src/report/index.ts';
import { startTestCluster } from '../test/support/cluster.ts';

const cluster = await startTestCluster({ workers: [{ nodeId: 'bench-py' }], env: { ROLLBOX_HEARTBEAT_MS: '1000' } });
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));
try {
  const token = await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec', 'sandbox:read']);
  const samplesFile = path.join(os.tmpdir(), `rollbox-bench-python-${process.pid}.json`);
  const script = path.resolve(import.meta.dirname, '../clients/python/bench/rollouts.py');
  const child = spawn('/usr/bin/python3', [script], {
    env: { ...process.env, ROLLBOX_URL: cluster.url, ROLLBOX_TOKEN: token, BENCH_SAMPLES_FILE: samplesFile },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
  if (code !== 0) throw new Error(`rollouts.py exited ${code}`);
  const result = JSON.parse(out.trim().split('\n').at(-1)!) as Record<string, unknown>;
  const samples = JSON.parse(readFileSync(samplesFile, 'utf8')) as { client: number[]; plain: number[] };
  const chart = writeCdfChart(path.resolve(import.meta.dirname, 'out', 'python-client.svg'), 'exec through the Python async client vs plain httpx, 64 rollouts at once', [
    { label: 'rollbox.aio client', samplesMs: samples.client },
    { label: 'plain httpx', samplesMs: samples.plain },
  ]);
  process.stderr.write(`chart: ${chart}\n`);
  console.log(JSON.stringify({ ...result, chart }));
} finally {
  await cluster.stop();
}
