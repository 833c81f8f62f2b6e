/**
 * bench:pause — first a job of BENCH_PAUSE_SANDBOXES (32) sandboxes with BENCH_PAUSE_TOUCHED_MIB
 * (128) MiB touched each, paused and resumed by job in each mode (freeze, swap, hibernate):
 * memory freed, pause and resume-to-first-command p50/p95, processes kept, against two
 * targets: swap frees >= 90% of what freeze holds, and its resume p50 is <= 2x reading the
 * paged-out bytes back sequentially from the same disk (measured in the same run). Then
 * freeze and resume through the HTTP API next to raw `runc pause` / `runc resume` of the
 * same container, then hibernate and wake against the size of the writable layer.
 * Ends with one JSON line.
 */
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { api, startTestCluster } from '../test/support/cluster.ts';
import { sandboxPaths, timed } from './support/runc-floor.ts';
import { benchPauseModes } from './support/pause-modes.ts';
import { progressBar, summarize, writeCdfChart } from '../src/report/index.ts';

const run = promisify(execFile);

function assertOk(response: { status: number; body: unknown }): void {
  if (response.status !== 200) throw new Error(`HTTP ${response.status}: ${JSON.stringify(response.body)}`);
}
const RUNS = Number(process.env.BENCH_RUNS ?? 100);
const SANDBOXES = Number(process.env.BENCH_PAUSE_SANDBOXES ?? 32);
const TOUCHED_MIB = Number(process.env.BENCH_PAUSE_TOUCHED_MIB ?? 128);

// Swap room for the whole job, with a margin for what its sandboxes hold beside memhold's buffer.
const swapFileMiB = SANDBOXES * (TOUCHED_MIB + 32) + 256;
// The production node-lost delay (tests use 1.5 s): a job's gigabytes going to swap on the disk
// Redis appends to delay its writes, heartbeats among them, by seconds (docs/operations.md).
const cluster = await startTestCluster({ env: { ROLLBOX_NODE_LOST_AFTER_MS: '30000' }, workers: [{ nodeId: 'bench-node', env: { ROLLBOX_SWAP_FILE_MIB: String(swapFileMiB) } }] });
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));
try {
  const token = await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec']);
  const modes = await benchPauseModes(cluster, token, { node: 'bench-node', sandboxes: SANDBOXES, touchedMiB: TOUCHED_MIB, rounds: Number(process.env.BENCH_PAUSE_ROUNDS ?? 3) });
  const byMode = Object.fromEntries(modes.figures.map((f) => [f.mode, f]));
  const ratio = (a: number, b: number) => Math.round((a / b) * 100) / 100;
  const swapTargets = {
    /** >= 0.9: what swap frees, over what freeze holds. */
    swapFreedOverFreezeHeld: ratio(byMode.swap!.freedMiB, byMode.freeze!.pausedMiB),
    /** <= 2: swap's resume-to-first-command p50 over reading its paged-out bytes back sequentially. */
    swapResumeP50OverSequentialRead: modes.floor ? ratio(byMode.swap!.resumeToFirstCommandP50Ms, modes.floor.readMs) : undefined,
  };
  process.stderr.write(`${JSON.stringify({ ...modes, swapTargets }, null, 1)}\n`);
  const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 } });
  const call = async (action: 'pause' | 'resume') => {
    const r = await api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/${action}`, {});
    if (r.status !== 200) throw new Error(`${action} failed: ${r.status} ${JSON.stringify(r.body)}`);
  };
  const pauses: number[] = [];
  const resumes: number[] = [];
  const bar = progressBar('pause + resume via HTTP', { total: RUNS });
  for (let i = 0; i < RUNS; i++) {
    pauses.push(await timed(() => call('pause')));
    resumes.push(await timed(() => call('resume')));
    bar.tick();
  }
  bar.done();

  const { runcRoot, containerId } = sandboxPaths(path.join(cluster.rootDir, 'bench-node', 'worker'), sandbox.id);
  const floorPauses: number[] = [];
  const floorResumes: number[] = [];
  const floorBar = progressBar('raw runc pause + resume', { total: RUNS });
  for (let i = 0; i < RUNS; i++) {
    floorPauses.push(await timed(() => run('runc', ['--root', runcRoot, 'pause', containerId])));
    floorResumes.push(await timed(() => run('runc', ['--root', runcRoot, 'resume', containerId])));
    floorBar.tick();
  }
  floorBar.done();
  await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandbox.id}`);

  // Hibernate and wake against the size of the writable layer.
  const hibernation: { writableMiB: number; hibernateP50Ms: number; wakeP50Ms: number }[] = [];
  const sizes = (process.env.BENCH_HIBERNATE_MIB ?? '0,16,64').split(',').map(Number);
  const hibernateRuns = Number(process.env.BENCH_HIBERNATE_RUNS ?? 5);
  const hBar = progressBar('hibernate + wake', { total: sizes.length * hibernateRuns });
  for (const mib of sizes) {
    const hib: number[] = [];
    const wake: number[] = [];
    // A fresh sandbox each run, so each hibernation packs exactly the blob (a woken sandbox
    // gets its packed layer copied back into its writable layer).
    for (let i = 0; i < hibernateRuns; i++) {
      const { body: s } = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 256 } });
      await api(cluster, token, 'POST', `/v1/sandboxes/${s.id}/exec`, { cmd: `head -c ${mib * 1024 * 1024} /dev/urandom > /root/blob`, timeoutMs: 120_000 });
      hib.push(await timed(async () => assertOk(await api(cluster, token, 'POST', `/v1/sandboxes/${s.id}/pause`, { mode: 'hibernate' }))));
      wake.push(await timed(async () => assertOk(await api(cluster, token, 'POST', `/v1/sandboxes/${s.id}/resume`, {}))));
      await api(cluster, token, 'DELETE', `/v1/sandboxes/${s.id}`);
      hBar.tick();
    }
    hibernation.push({ writableMiB: mib, hibernateP50Ms: summarize(hib).p50Ms, wakeP50Ms: summarize(wake).p50Ms });
  }
  hBar.done();

  const p = summarize(pauses);
  const r = summarize(resumes);
  const fp = summarize(floorPauses);
  const fr = summarize(floorResumes);
  const chart = writeCdfChart(path.resolve(import.meta.dirname, 'out', 'pause-latency.svg'), 'freeze / resume latency', [
    { label: 'rollbox pause (HTTP)', samplesMs: pauses },
    { label: 'rollbox resume (HTTP)', samplesMs: resumes },
    { label: 'raw runc pause', samplesMs: floorPauses },
    { label: 'raw runc resume', samplesMs: floorResumes },
  ]);
  process.stderr.write(`chart: ${chart}\n`);
  console.log(
    JSON.stringify({
      bench: 'pause',
      p50Ms: p.p50Ms,
      p99Ms: p.p99Ms,
      floorP50Ms: fp.p50Ms,
      ratioP50: Math.round((p.p50Ms / fp.p50Ms) * 100) / 100,
      resumeP50Ms: r.p50Ms,
      resumeP99Ms: r.p99Ms,
      resumeFloorP50Ms: fr.p50Ms,
      resumeRatioP50: Math.round((r.p50Ms / fr.p50Ms) * 100) / 100,
      perSecond: Math.round((1000 / (p.meanMs + r.meanMs)) * 10) / 10,
      n: RUNS,
      hibernation,
      pauseModes: { ...modes, targets: swapTargets },
      reference: { cubeSandboxSnapshotMs: 46, cubeSandboxResumeMs: 42 },
      chart,
    }),
  );
} finally {
  await cluster.stop();
}
