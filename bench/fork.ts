/**
 * bench:fork — a sandbox with S MiB written (in 1,000 files) forked into N children
 * (`POST /v1/sandboxes/:id/fork`), beside the same state reached by a snapshot and N
 * creates on it (issued at once, as a client would), and N plain creates from the base
 * (the floor: starting N sandboxes at all), in the same run. Per cell: time until every
 * child runs, the parent's frozen time, bytes the host wrote (layer store plus scratch
 * filesystem). Then the microVM arm (support/fork-microvm.ts): a VM with 64 MiB of memory
 * touched forked into N children that keep its processes, beside a container's fork in the
 * same run (BENCH_FORK_TIERS=container,microvm; a host without the microVM tier skips it).
 * Ends with one JSON line.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { api, startTestCluster } from '../test/support/cluster.ts';
import { timed } from './support/runc-floor.ts';
import { microVmForkArm, type VmForkCell } from './support/fork-microvm.ts';
import { progressBar, summarize } from '../src/report/index.ts';

const SIZES_MIB = (process.env.BENCH_FORK_MIB ?? '16,64,256').split(',').map(Number);
const COUNTS = (process.env.BENCH_FORK_CHILDREN ?? '1,8,32').split(',').map(Number);
const RUNS = Number(process.env.BENCH_RUNS ?? 2);
const FILES = 1000;
const TIERS = (process.env.BENCH_FORK_TIERS ?? 'container,microvm').split(',');
const VM_COUNTS = (process.env.BENCH_FORK_VM_CHILDREN ?? '1,4,8').split(',').map(Number);

const cluster = await startTestCluster({ workers: [{ nodeId: 'bench-fork' }] });
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));

/** Bytes in use on the filesystems the host writes sandbox state to: its layer store and its scratch filesystem. */
function hostBytesUsed(): number {
  const layerStore = Number(execFileSync('du', ['-s', '--block-size=1', path.join(cluster.rootDir, 'layers')], { encoding: 'utf8' }).split('\t')[0]);
  const scratch = fs
    .readFileSync('/proc/mounts', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[1] ?? '')
    .find((m) => m.startsWith(cluster.rootDir) && m.endsWith('/scratch'));
  const s = scratch ? fs.statfsSync(scratch) : undefined;
  return layerStore + (s ? (s.blocks - s.bfree) * s.bsize : 0);
}

interface Cell {
  writtenMiB: number;
  children: number;
  forkMs: number;
  parentFrozenMs: number;
  forkHostBytes: number;
  snapshotCreatesMs: number;
  snapshotCreatesHostBytes: number;
  plainCreatesMs: number;
  /** fork / (snapshot + N creates): the target is at most 0.5 at 8 children of 64 MiB. */
  ratioToSnapshotCreates: number;
  ratioToPlainCreates: number;
}

try {
  const token = await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec', 'sandbox:snapshot', 'sandbox:read']);
  const call = async (method: string, urlPath: string, body?: unknown) => {
    const r = await api(cluster, token, method, urlPath, body);
    if (r.status >= 300) throw new Error(`${method} ${urlPath}: ${r.status} ${JSON.stringify(r.body)}`);
    return r.body;
  };
  const removeAll = async (ids: string[]) => {
    for (let i = 0; i < ids.length; i += 8) await Promise.all(ids.slice(i, i + 8).map((id) => call('DELETE', `/v1/sandboxes/${id}`)));
  };
  const createN = async (n: number, body: unknown) => Promise.all(Array.from({ length: n }, async () => (await call('POST', '/v1/sandboxes', body)).id as string));
  const cells: Cell[] = [];
  const containerCells = TIERS.includes('container') ? SIZES_MIB.length * COUNTS.length : 0;
  const bar = progressBar('fork vs snapshot + creates', { total: containerCells * RUNS });
  for (const mib of containerCells ? SIZES_MIB : []) {
    const resources = { memoryMiB: 256, diskMiB: mib * 2 + 128 };
    const parent = await call('POST', '/v1/sandboxes', { resources });
    const fileBytes = Math.floor((mib * 1024 * 1024) / FILES);
    await call('POST', `/v1/sandboxes/${parent.id}/exec`, { cmd: `mkdir /data && i=0; while [ $i -lt ${FILES} ]; do head -c ${fileBytes} /dev/urandom > /data/f$i; i=$((i+1)); done`, timeoutMs: 300_000 });
    for (const n of COUNTS) {
      const forks: number[] = [];
      const frozen: number[] = [];
      const forkBytes: number[] = [];
      const snaps: number[] = [];
      const snapBytes: number[] = [];
      const plains: number[] = [];
      for (let run = 0; run < RUNS; run++) {
        // Each arm packs a fresh state: the parent changes a little between them.
        await call('POST', `/v1/sandboxes/${parent.id}/exec`, { cmd: 'echo $RANDOM > /data/nonce' });
        let before = hostBytesUsed();
        let result: { children: { id?: string; state?: string }[]; parentFrozenMs?: number; created: number } | undefined;
        forks.push(await timed(async () => (result = await call('POST', `/v1/sandboxes/${parent.id}/fork`, { count: n }))));
        forkBytes.push(hostBytesUsed() - before);
        if (result!.created !== n) throw new Error(`fork made ${result!.created} of ${n} children: ${JSON.stringify(result!.children.find((c) => c.state !== 'running'))}`);
        frozen.push(result!.parentFrozenMs ?? 0);
        await removeAll(result!.children.map((c) => c.id!));

        await call('POST', `/v1/sandboxes/${parent.id}/exec`, { cmd: 'echo $RANDOM > /data/nonce' });
        before = hostBytesUsed();
        let restored: string[] = [];
        snaps.push(
          await timed(async () => {
            const layer = await call('POST', `/v1/sandboxes/${parent.id}/snapshot`, {});
            restored = await createN(n, { image: { base: 'busybox', layers: [layer.digest] }, resources });
          }),
        );
        snapBytes.push(hostBytesUsed() - before);
        await removeAll(restored);

        let plain: string[] = [];
        plains.push(await timed(async () => (plain = await createN(n, { resources }))));
        await removeAll(plain);
        bar.tick();
      }
      const p50 = (xs: number[]) => summarize(xs).p50Ms;
      const cell = {
        writtenMiB: mib,
        children: n,
        forkMs: Math.round(p50(forks)),
        parentFrozenMs: Math.round(p50(frozen) * 10) / 10,
        forkHostBytes: Math.round(p50(forkBytes)),
        snapshotCreatesMs: Math.round(p50(snaps)),
        snapshotCreatesHostBytes: Math.round(p50(snapBytes)),
        plainCreatesMs: Math.round(p50(plains)),
        ratioToSnapshotCreates: Math.round((p50(forks) / p50(snaps)) * 100) / 100,
        ratioToPlainCreates: Math.round((p50(forks) / p50(plains)) * 100) / 100,
      };
      cells.push(cell);
      console.error(JSON.stringify(cell));
    }
    await call('DELETE', `/v1/sandboxes/${parent.id}`);
  }
  bar.done();
  let microvm: { accelerator: string; cells: VmForkCell[] } | undefined;
  const admin = await cluster.token('bench-admin', ['admin']);
  // The first heartbeat names the host's accelerator (none: no microVM tier on this host).
  let accelerator: string | undefined;
  for (let i = 0; i < 50 && !accelerator; i++) {
    accelerator = (await api(cluster, admin, 'GET', '/v1/nodes')).body.nodes?.[0]?.tiers?.microvm?.accelerator as string | undefined;
    if (!accelerator) await new Promise((r) => setTimeout(r, 200));
  }
  if (TIERS.includes('microvm') && accelerator) {
    const vmBar = progressBar(`microVM fork (${accelerator}) beside a container's`, { total: VM_COUNTS.length * RUNS });
    microvm = { accelerator, cells: await microVmForkArm(cluster, token, VM_COUNTS, RUNS, () => vmBar.tick()) };
    vmBar.done();
  }
  const target = cells.find((c) => c.writtenMiB === 64 && c.children === 8) ?? cells[0];
  const vmTarget = microvm?.cells.find((c) => c.children === 8) ?? microvm?.cells.at(-1);
  console.log(
    JSON.stringify({
      bench: 'fork',
      ...(target ? { p50Ms: target.forkMs, floorP50Ms: target.snapshotCreatesMs, ratioP50: target.ratioToSnapshotCreates, parentFrozenMs: target.parentFrozenMs } : {}),
      ...(vmTarget ? { microvmP50Ms: vmTarget.vmForkMs, microvmParentFrozenMs: vmTarget.vmParentFrozenMs, microvmRatioToContainer: vmTarget.ratioVmToContainer } : {}),
      note: `p50Ms = fork of a 64 MiB sandbox into 8 children until all run; floor = snapshot + 8 creates at once on it; parentFrozenMs = the parent frozen while its writable layer is packed; targets: ratio <= 0.5, frozen <= 100 ms. microvm* (${microvm?.accelerator ?? 'not run'}): a VM with 64 MiB of memory touched forked into ${vmTarget?.children ?? '-'} children keeping its processes, beside a container's fork of 64 MiB in files; no targets under TCG`,
      cells,
      ...(microvm ? { microvm } : {}),
    }),
  );
} finally {
  await cluster.stop();
}
