import { execFileSync } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { percentile, progressBar } from '../../src/report/index.ts';
import { api, type TestCluster } from '../../test/support/cluster.ts';
import { buildMemhold } from '../../test/support/memhold.ts';

const MIB = 1024 * 1024;

export interface PauseModeFigures {
  mode: 'freeze' | 'swap' | 'hibernate';
  /** Host memory the job's sandboxes held running, and after the pause (their cgroups; a hibernated sandbox holds none). */
  heldMiB: number;
  pausedMiB: number;
  freedMiB: number;
  /** One `POST /v1/jobs/:job/pause` of every sandbox, wall time over the rounds. */
  pauseP50Ms: number;
  pauseP95Ms: number;
  /** From `POST /v1/jobs/:job/resume` to each sandbox's first command done, over every sandbox and round. */
  resumeToFirstCommandP50Ms: number;
  resumeToFirstCommandP95Ms: number;
  /** Sandboxes whose memhold process answered with its first checksum after the last resume. */
  processesKept: number;
  rounds: number;
}

const p = (samples: number[], q: number) => Math.round(percentile([...samples].sort((a, b) => a - b), q) * 10) / 10;

/**
 * `sandboxes` sandboxes of one job, each running memhold over `touchedMiB`, paused and
 * resumed by job in each mode, one mode after the other (hibernate last: it ends the
 * processes). Beside them the floor swap is held to: reading the bytes it paged out back
 * sequentially (O_DIRECT) from a file on the disk that holds the swap file, in the same run.
 */
export async function benchPauseModes(cluster: TestCluster, token: string, options: { node: string; sandboxes: number; touchedMiB: number; rounds: number }) {
  const { node, sandboxes: count, touchedMiB, rounds } = options;
  const memhold = readFileSync(buildMemhold(cluster.rootDir));
  const job = 'bench-pause-modes';
  const bar = progressBar(`${count} sandboxes with ${touchedMiB} MiB touched`, { total: count });
  const ids: string[] = [];
  const checksums = new Map<string, string>();
  const exec = async (id: string, cmd: string) => {
    const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs: 120_000 });
    if (r.status !== 200) throw new Error(`exec in ${id}: HTTP ${r.status} ${JSON.stringify(r.body)}`);
    return r.body.stdout as string;
  };
  // A few at a time: two cores fill 128 MiB each.
  for (let i = 0; i < count; i += 4) {
    await Promise.all(
      Array.from({ length: Math.min(4, count - i) }, async () => {
        const created = await api(cluster, token, 'POST', '/v1/sandboxes', { job, resources: { memoryMiB: touchedMiB + 64 } });
        if (created.status !== 201) throw new Error(`create: HTTP ${created.status} ${JSON.stringify(created.body)}`);
        const id = created.body.id as string;
        await api(cluster, token, 'PUT', `/v1/sandboxes/${id}/files?path=/root/memhold&mode=0755`, memhold, { 'content-type': 'application/octet-stream' });
        await exec(id, `/root/memhold ${touchedMiB} /root/held.log </dev/null >/dev/null 2>&1 & echo $! > /root/memhold.pid; while [ ! -s /root/held.log ]; do sleep 0.05; done`);
        checksums.set(id, (await exec(id, 'head -1 /root/held.log')).trim());
        ids.push(id);
        bar.tick();
      }),
    );
  }
  bar.done();

  const cgroupFile = (id: string, file: string) => `/sys/fs/cgroup/memory/rollbox/${node}/rb-${id}/${file}`;
  const heldBytes = () => ids.reduce((sum, id) => sum + (() => {
    try {
      return Number(readFileSync(cgroupFile(id, 'memory.usage_in_bytes'), 'utf8'));
    } catch {
      return 0; // hibernated: no cgroup
    }
  })(), 0);
  const swappedBytes = () => ids.reduce((sum, id) => sum + Number(/^total_swap (\d+)$/m.exec(readFileSync(cgroupFile(id, 'memory.stat'), 'utf8'))?.[1] ?? 0), 0);
  const call = async (action: 'pause' | 'resume', body: object) => {
    const r = await api(cluster, token, 'POST', `/v1/jobs/${job}/${action}`, body);
    const failed = r.body.results?.filter((x: { outcome: string }) => x.outcome === 'failed');
    if (r.status !== 200 || failed?.length) throw new Error(`job ${action}: HTTP ${r.status} ${JSON.stringify(failed ?? r.body).slice(0, 500)}`);
  };

  const figures: PauseModeFigures[] = [];
  let floor: { bytes: number; readMs: number } | undefined;
  for (const mode of ['freeze', 'swap', 'hibernate'] as const) {
    const modeRounds = mode === 'hibernate' ? 1 : rounds;
    const pauses: number[] = [];
    const resumes: number[] = [];
    let held = 0;
    let paused = 0;
    const mBar = progressBar(`job pause + resume (${mode})`, { total: modeRounds });
    for (let round = 0; round < modeRounds; round++) {
      held = heldBytes();
      let started = performance.now();
      await call('pause', { mode });
      pauses.push(performance.now() - started);
      paused = heldBytes();
      if (mode === 'swap' && !floor) floor = sequentialReadFloor(path.join(cluster.rootDir, node, 'worker'), swappedBytes());
      started = performance.now();
      await call('resume', {});
      resumes.push(...(await Promise.all(ids.map(async (id) => (await exec(id, 'true'), performance.now() - started)))));
      mBar.tick();
    }
    mBar.done();
    // The same process, with the memory it filled: it answers its first checksum again.
    const kept = await Promise.all(
      ids.map(async (id) => {
        const before = (await exec(id, 'wc -l < /root/held.log 2>/dev/null || echo 0')).trim();
        const ok = await exec(id, `kill -USR1 $(cat /root/memhold.pid) 2>/dev/null || exit 0; while [ "$(wc -l < /root/held.log)" -le ${Number(before)} ]; do sleep 0.05; done; tail -1 /root/held.log`).catch(() => '');
        return ok.trim() === checksums.get(id);
      }),
    );
    figures.push({
      mode,
      heldMiB: Math.round(held / MIB),
      pausedMiB: Math.round(paused / MIB),
      freedMiB: Math.round((held - paused) / MIB),
      pauseP50Ms: p(pauses, 50),
      pauseP95Ms: p(pauses, 95),
      resumeToFirstCommandP50Ms: p(resumes, 50),
      resumeToFirstCommandP95Ms: p(resumes, 95),
      processesKept: kept.filter(Boolean).length,
      rounds: modeRounds,
    });
  }
  await Promise.all(ids.map((id) => api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)));
  return { sandboxes: count, touchedMiB, figures, floor };
}

/**
 * The floor: `bytes` written to a file beside the swap file, then read back sequentially
 * with O_DIRECT (no page cache, as swap reads are), timed.
 */
function sequentialReadFloor(dir: string, bytes: number): { bytes: number; readMs: number } {
  const file = path.join(dir, 'bench-floor');
  const blocks = Math.max(1, Math.ceil(bytes / (4 * MIB)));
  try {
    execFileSync('dd', ['if=/dev/urandom', `of=${file}`, 'bs=4M', `count=${blocks}`, 'oflag=direct', 'status=none']);
    const started = performance.now();
    execFileSync('dd', [`if=${file}`, 'of=/dev/null', 'bs=4M', 'iflag=direct', 'status=none']);
    return { bytes: blocks * 4 * MIB, readMs: Math.round((performance.now() - started) * 10) / 10 };
  } finally {
    rmSync(file, { force: true });
  }
}
