import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { api, startTestCluster } from '../../test/support/cluster.ts';
import { timed } from './runc-floor.ts';

/**
 * Host memory of idle microVMs with guest memory handed back (ROLLBOX_VM_RETURN_MEMORY on)
 * and without (off), each mode on a worker host of its own, the same steps in the same
 * run: `vms` VMs booted and left idle, then each runs a command that fills and frees
 * 200 MiB and one that leaves a 96 MiB file in its page cache, and is left idle again.
 * Per VM: the QEMU process's RSS and its guest RAM file's resident pages, and the CPU
 * QEMU used (idle windows and the commands), so the mechanism's cost is read beside its gain.
 * Last, the seed's time-integrated memory: every VM runs the same scripted agent session at
 * once (a data file written and read, a build-like 160 MiB allocation, a source tree read,
 * each followed by a think time as an agent's model call), QEMU RSS and RAM file sampled
 * every SAMPLE_MS and integrated over the session (MiB x s, and its mean MiB).
 */
export interface VmMemoryFigures {
  /** Mean per VM, MiB. */
  idleAfterBoot: { rssMiB: number; ramFileMiB: number };
  idleAfterUse: { rssMiB: number; ramFileMiB: number };
  /** QEMU CPU per VM, ms: over `idleWindowMs` after boot, over the commands, over `idleWindowMs` after them. */
  cpuMs: { idleAfterBoot: number; commands: number; idleAfterUse: number };
  /** Create to a running VM (the boot under TCG: what a smaller translation buffer costs), ms p50 over the VMs. */
  createMs: number;
  /** The fill of 200 MiB run again once the guest gave the first back (its pages fault in on the host again), ms p50 over the VMs. */
  refillMs: number;
  /** The scripted agent session, per VM: host memory integrated over it (MiB x s) and its mean (MiB), and its length. */
  session: { seconds: number; rssMiBSeconds: number; ramFileMiBSeconds: number; meanRssMiB: number; meanRamFileMiB: number };
}

const GUEST_MIB = 384;
const SAMPLE_MS = 250;
const SESSION_ROUNDS = 2;
const THINK_MS = 4000;
/** One round of an agent's tool calls (the model's think time between them is the caller's). */
const SESSION_STEPS = [
  'dd if=/dev/urandom of=/root/data bs=1M count=48 2>/dev/null && sha256sum /root/data >/dev/null',
  'dd if=/dev/zero of=/dev/null bs=160M count=1 2>/dev/null',
  'find / -xdev -type f 2>/dev/null | head -n 3000 | xargs cat >/dev/null 2>&1; true',
  'rm -f /root/data',
];

const ramFileMiB = (file: string): number => Number(execFileSync('du', ['-k', file]).toString().split('\t')[0]) / 1024;
const rssMiB = (pid: number): number => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0) / 1024;
const cpuMsOf = (pid: number): number => {
  const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').replace(/^.*\) /, '').split(' ');
  return (Number(f[11]) + Number(f[12])) * 10;
};
const mean = (xs: number[]): number => Math.round((xs.reduce((a, b) => a + b, 0) / xs.length) * 10) / 10;

export async function measureVmMemory(mode: 'on' | 'off', vms: number, idleWindowMs: number, log: (line: string) => void): Promise<VmMemoryFigures> {
  const nodeId = `bench-vmmem-${mode}`;
  const cluster = await startTestCluster({ workers: [{ nodeId, env: { ROLLBOX_VM_RETURN_MEMORY: mode } }] });
  try {
    const token = await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec']);
    const sh = async (id: string, cmd: string) => {
      const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs: 300_000 });
      if (r.body.exitCode !== 0) throw new Error(`${cmd}: ${JSON.stringify(r.body)}`);
    };
    const ids: string[] = [];
    const creates: number[] = [];
    for (let i = 0; i < vms; i++) {
      creates.push(await timed(async () => {
        const r = await api(cluster, token, 'POST', '/v1/sandboxes', { tier: 'microvm', resources: { memoryMiB: GUEST_MIB, cpuMillis: 1000 } });
        if (r.status !== 201) throw new Error(`create failed: ${r.status} ${JSON.stringify(r.body)}`);
        ids.push(r.body.id);
      }));
    }
    const pids = ids.map((id) => JSON.parse(fs.readFileSync(path.join(cluster.rootDir, nodeId, 'worker', 'microvm', id, 'vm.json'), 'utf8')).pid as number);
    const ramFiles = ids.map((id) => path.join('/dev/shm', `rollbox-vm-ram-${nodeId}`, `${id}.ram`));
    const snapshot = () => ({ rssMiB: mean(pids.map(rssMiB)), ramFileMiB: mean(ramFiles.map(ramFileMiB)) });
    const cpu = () => pids.map(cpuMsOf);
    const perVm = (before: number[], after: number[]) => mean(after.map((a, i) => a - before[i]!));

    const t0 = cpu();
    await new Promise((r) => setTimeout(r, idleWindowMs));
    const t1 = cpu();
    const idleAfterBoot = snapshot();
    for (const id of ids) {
      await sh(id, 'dd if=/dev/zero of=/dev/null bs=200M count=1 2>/dev/null');
      await sh(id, 'dd if=/dev/zero of=/root/cold bs=1M count=96 2>/dev/null && sync');
    }
    const t2 = cpu();
    await new Promise((r) => setTimeout(r, idleWindowMs));
    const t3 = cpu();
    const idleAfterUse = snapshot();
    const p50 = (xs: number[]) => Math.round([...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!);
    const refills: number[] = [];
    for (const id of ids) refills.push(await timed(() => sh(id, 'dd if=/dev/zero of=/dev/null bs=200M count=1 2>/dev/null')));

    // The agent session, on every VM at once, sampled throughout.
    const samples: { atMs: number; rssMiB: number; ramFileMiB: number }[] = [];
    const sample = () => samples.push({ atMs: performance.now(), ...snapshot() });
    sample();
    const sampler = setInterval(sample, SAMPLE_MS);
    try {
      await Promise.all(ids.map(async (id) => {
        for (let round = 0; round < SESSION_ROUNDS; round++) {
          for (const step of SESSION_STEPS) {
            await sh(id, step);
            await new Promise((r) => setTimeout(r, THINK_MS));
          }
        }
      }));
    } finally {
      clearInterval(sampler);
    }
    sample();
    const integrate = (of: 'rssMiB' | 'ramFileMiB') => samples.slice(1).reduce((sum, s, i) => sum + ((s[of] + samples[i]![of]) / 2) * ((s.atMs - samples[i]!.atMs) / 1000), 0);
    const seconds = (samples.at(-1)!.atMs - samples[0]!.atMs) / 1000;
    const round1 = (x: number) => Math.round(x * 10) / 10;
    const session = { seconds: round1(seconds), rssMiBSeconds: Math.round(integrate('rssMiB')), ramFileMiBSeconds: Math.round(integrate('ramFileMiB')), meanRssMiB: round1(integrate('rssMiB') / seconds), meanRamFileMiB: round1(integrate('ramFileMiB') / seconds) };

    const figures: VmMemoryFigures = {
      idleAfterBoot,
      idleAfterUse,
      cpuMs: { idleAfterBoot: perVm(t0, t1), commands: perVm(t1, t2), idleAfterUse: perVm(t2, t3) },
      createMs: p50(creates),
      refillMs: p50(refills),
      session,
    };
    log(`return memory ${mode}: ${JSON.stringify(figures)}`);
    for (const id of ids) await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
    return figures;
  } finally {
    await cluster.stop();
  }
}
