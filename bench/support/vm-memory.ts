import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { api, startTestCluster } from '../../test/support/cluster.ts';
import { timed } from './runc-floor.ts';

/**
 * Host memory of idle microVMs with guest memory handed back (ROLLBOX_VM_RETURN_MEMORY on)
 * and without (off), each mode on a worker host of its own, the same steps in the same
 * run: `vms` VMs booted and left idle, then each runs a command that fills and frees
 * 200 MiB and one that leaves a 96 MiB file in its page cache, and is left idle again.
 * Per VM: the QEMU process's RSS and its guest RAM file's resident pages, and the CPU
 * QEMU used (idle windows and the commands), so the mechanism's cost is read beside its gain.
 */
export interface VmMemoryFigures {
  /** Mean per VM, MiB. */
  idleAfterBoot: { rssMiB: number; ramFileMiB: number };
  idleAfterUse: { rssMiB: number; ramFileMiB: number };
  /** QEMU CPU per VM, ms: over `idleWindowMs` after boot, over the commands, over `idleWindowMs` after them. */
  cpuMs: { idleAfterBoot: number; commands: number; idleAfterUse: number };
  /** The fill of 200 MiB run again once the guest gave the first back (its pages fault in on the host again), ms p50 over the VMs. */
  refillMs: number;
}

const GUEST_MIB = 384;

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
    for (let i = 0; i < vms; i++) {
      const r = await api(cluster, token, 'POST', '/v1/sandboxes', { tier: 'microvm', resources: { memoryMiB: GUEST_MIB, cpuMillis: 1000 } });
      if (r.status !== 201) throw new Error(`create failed: ${r.status} ${JSON.stringify(r.body)}`);
      ids.push(r.body.id);
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
    const refills: number[] = [];
    for (const id of ids) refills.push(await timed(() => sh(id, 'dd if=/dev/zero of=/dev/null bs=200M count=1 2>/dev/null')));
    refills.sort((a, b) => a - b);
    const figures: VmMemoryFigures = {
      idleAfterBoot,
      idleAfterUse,
      cpuMs: { idleAfterBoot: perVm(t0, t1), commands: perVm(t1, t2), idleAfterUse: perVm(t2, t3) },
      refillMs: Math.round(refills[Math.floor(refills.length / 2)]!),
    };
    log(`return memory ${mode}: ${JSON.stringify(figures)}`);
    for (const id of ids) await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
    return figures;
  } finally {
    await cluster.stop();
  }
}
