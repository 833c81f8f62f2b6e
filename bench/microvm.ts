/**
 * bench:microvm — the microVM tier beside the container tier, in the same run on the same
 * host: create-to-first-command (POST create, then the first exec of `true`), exec p50 of
 * `true` through the HTTP API, and host memory per idle microVM (the QEMU process's RSS,
 * guest RAM it touched included). The accelerator is named: under TCG (no VT-x here) the
 * microVM figures say nothing about KVM hosts, so no targets. Then snapshots (pack_diff) of
 * the same sandboxes with SNAPSHOT_MIB written in one file and 500 small ones: the
 * snapshot's time through the API, and how long the sandbox was frozen (a 1-child fork's
 * parentFrozenMs, the same pack). First, guest memory handed back (bench/support/vm-memory.ts):
 * host memory per idle VM with ROLLBOX_VM_RETURN_MEMORY off and on, after boot and after
 * use, over a scripted agent session (time-integrated), and its CPU cost (BENCH_MEMORY_ONLY=1: only that part). Ends with one JSON line.
 */
import fs from 'node:fs';
import path from 'node:path';
import { api, startTestCluster } from '../test/support/cluster.ts';
import { timed } from './support/runc-floor.ts';
import { measureVmMemory } from './support/vm-memory.ts';
import { summarize } from '../src/report/index.ts';

const CREATES = Number(process.env.BENCH_CREATES ?? 3);
const EXECS = Number(process.env.BENCH_EXECS ?? 60);
const SNAPSHOT_MIB = Number(process.env.BENCH_SNAPSHOT_MIB ?? 64);

// Guest memory handed back (ROLLBOX_VM_RETURN_MEMORY) off, then on, each on a host of its own: host memory per idle VM and its CPU cost.
const MEMORY_VMS = Number(process.env.BENCH_MEMORY_VMS ?? 2);
const IDLE_WINDOW_MS = Number(process.env.BENCH_IDLE_WINDOW_MS ?? 20_000);
const log = (line: string) => process.stderr.write(`${line}\n`);
const memOff = await measureVmMemory('off', MEMORY_VMS, IDLE_WINDOW_MS, log);
const memOn = await measureVmMemory('on', MEMORY_VMS, IDLE_WINDOW_MS, log);
const ratio = (on: number, off: number) => Math.round((on / off) * 100) / 100;
const returnMemory = {
  vms: MEMORY_VMS,
  guestMemoryMiB: 384,
  off: memOff,
  on: memOn,
  // Targets: idle host memory per VM <= 0.5 of off's (DSec's free page reporting + cold cache reclaim).
  idleAfterBootRssRatio: ratio(memOn.idleAfterBoot.rssMiB, memOff.idleAfterBoot.rssMiB),
  idleAfterBootRamFileRatio: ratio(memOn.idleAfterBoot.ramFileMiB, memOff.idleAfterBoot.ramFileMiB),
  idleAfterUseRssRatio: ratio(memOn.idleAfterUse.rssMiB, memOff.idleAfterUse.rssMiB),
  idleAfterUseRamFileRatio: ratio(memOn.idleAfterUse.ramFileMiB, memOff.idleAfterUse.ramFileMiB),
  cpuRatio: { idleAfterBoot: ratio(memOn.cpuMs.idleAfterBoot, memOff.cpuMs.idleAfterBoot), commands: ratio(memOn.cpuMs.commands, memOff.cpuMs.commands), idleAfterUse: ratio(memOn.cpuMs.idleAfterUse, memOff.cpuMs.idleAfterUse) },
  refillRatio: ratio(memOn.refillMs, memOff.refillMs),
  createRatio: ratio(memOn.createMs, memOff.createMs),
  // The seed's figure: host memory integrated over the same scripted agent session (DSec: -21.2%).
  sessionRssMiBSecondsRatio: ratio(memOn.session.rssMiBSeconds, memOff.session.rssMiBSeconds),
  sessionRamFileMiBSecondsRatio: ratio(memOn.session.ramFileMiBSeconds, memOff.session.ramFileMiBSeconds),
};
if (process.env.BENCH_MEMORY_ONLY) {
  console.log(JSON.stringify({ bench: 'microvm', returnMemory }));
  process.exit(0);
}

const cluster = await startTestCluster({ workers: [{ nodeId: 'bench-vm' }] });
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));
try {
  const token = await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec', 'sandbox:snapshot', 'admin']);
  const exec = async (id: string) => {
    const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { argv: ['true'] });
    if (r.status !== 200 || r.body.exitCode !== 0) throw new Error(`exec failed: ${r.status} ${JSON.stringify(r.body)}`);
  };
  // Idle microVMs: each QEMU's resident memory (the guest RAM it touched included), once the guests have settled.
  const qemuRssMiB = async (ids: string[]): Promise<number[]> => {
    await new Promise((r) => setTimeout(r, 2000));
    return ids.map((id) => {
      const pid = JSON.parse(fs.readFileSync(path.join(cluster.rootDir, 'bench-vm', 'worker', 'microvm', id, 'vm.json'), 'utf8')).pid as number;
      return Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0) / 1024;
    });
  };
  const tier = async (name: 'container' | 'microvm', idleRssMiB?: (ids: string[]) => Promise<number[]>) => {
    const firstCommandMs: number[] = [];
    const ids: string[] = [];
    for (let i = 0; i < CREATES; i++) {
      firstCommandMs.push(
        await timed(async () => {
          const r = await api(cluster, token, 'POST', '/v1/sandboxes', { tier: name, resources: { memoryMiB: 256, cpuMillis: 1000 } });
          if (r.status !== 201) throw new Error(`create failed: ${r.status} ${JSON.stringify(r.body)}`);
          ids.push(r.body.id);
          await exec(r.body.id);
        }),
      );
      process.stderr.write(`${name} create ${i + 1}/${CREATES}: ${Math.round(firstCommandMs.at(-1)!)} ms\n`);
    }
    const execMs: number[] = [];
    for (let i = 0; i < EXECS; i++) execMs.push(await timed(() => exec(ids[0]!)));
    const rssMiB = (await idleRssMiB?.(ids)) ?? [];
    const hibernateMs: number[] = [];
    const wakeMs: number[] = [];
    for (const id of ids) {
      const touched = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd: 'head -c 67108864 /dev/urandom > /dev/shm/touched' });
      if (touched.body.exitCode !== 0) throw new Error(`touching memory failed: ${JSON.stringify(touched.body)}`);
      hibernateMs.push(await timed(async () => {
        const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/pause`, { mode: 'hibernate' });
        if (r.body.state !== 'hibernated') throw new Error(`hibernate failed: ${JSON.stringify(r.body)}`);
      }));
      wakeMs.push(await timed(async () => {
        const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/resume`, {});
        if (r.body.state !== 'running') throw new Error(`wake failed: ${JSON.stringify(r.body)}`);
        await exec(id);
      }));
      process.stderr.write(`${name} hibernate ${Math.round(hibernateMs.at(-1)!)} ms, wake to first command ${Math.round(wakeMs.at(-1)!)} ms\n`);
    }
    const snapshotMs: number[] = [];
    const frozenMs: number[] = [];
    for (const id of ids) {
      const cmd = `rm -f /dev/shm/touched; mkdir /root/files && i=0; while [ $i -lt 500 ]; do echo $i > /root/files/$i; i=$((i+1)); done; head -c ${SNAPSHOT_MIB * 1048576} /dev/urandom > /root/big`;
      const wrote = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs: 300_000 });
      if (wrote.body.exitCode !== 0) throw new Error(`writing failed: ${JSON.stringify(wrote.body)}`);
      snapshotMs.push(await timed(async () => {
        const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/snapshot`, {});
        if (r.status !== 201) throw new Error(`snapshot failed: ${r.status} ${JSON.stringify(r.body)}`);
      }));
      const forked = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/fork`, { count: 1, processes: false });
      if (forked.status !== 201) throw new Error(`fork failed: ${forked.status} ${JSON.stringify(forked.body)}`);
      frozenMs.push(forked.body.parentFrozenMs);
      await api(cluster, token, 'DELETE', `/v1/sandboxes/${forked.body.children[0].id}`);
      process.stderr.write(`${name} snapshot of ${SNAPSHOT_MIB} MiB + 500 files ${Math.round(snapshotMs.at(-1)!)} ms, frozen ${Math.round(frozenMs.at(-1)!)} ms\n`);
    }
    return { ids, rssMiB, create: summarize(firstCommandMs), exec: summarize(execMs), hibernate: summarize(hibernateMs), wake: summarize(wakeMs), snapshot: summarize(snapshotMs), frozen: summarize(frozenMs) };
  };
  const containers = await tier('container');
  // Read once the host has heartbeated (it has: it took the creates).
  const nodes = await api(cluster, token, 'GET', '/v1/nodes');
  const accelerator = nodes.body.nodes.find((n: { nodeId: string }) => n.nodeId === 'bench-vm')?.tiers?.microvm?.accelerator ?? 'none';
  const vms = await tier('microvm', qemuRssMiB);
  const { rssMiB } = vms;
  for (const id of [...containers.ids, ...vms.ids]) await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
  const result = {
    bench: 'microvm',
    accelerator,
    creates: CREATES,
    execs: EXECS,
    createToFirstCommandP50Ms: { container: containers.create.p50Ms, microvm: vms.create.p50Ms, ratio: Math.round((vms.create.p50Ms / containers.create.p50Ms) * 10) / 10 },
    execP50Ms: { container: containers.exec.p50Ms, microvm: vms.exec.p50Ms, ratio: Math.round((vms.exec.p50Ms / containers.exec.p50Ms) * 100) / 100 },
    hibernateP50Ms: { container: containers.hibernate.p50Ms, microvm: vms.hibernate.p50Ms, ratio: Math.round((vms.hibernate.p50Ms / containers.hibernate.p50Ms) * 100) / 100 },
    wakeToFirstCommandP50Ms: { container: containers.wake.p50Ms, microvm: vms.wake.p50Ms, ratio: Math.round((vms.wake.p50Ms / containers.wake.p50Ms) * 100) / 100 },
    touchedMiB: 64,
    snapshotP50Ms: { container: containers.snapshot.p50Ms, microvm: vms.snapshot.p50Ms, ratio: Math.round((vms.snapshot.p50Ms / containers.snapshot.p50Ms) * 10) / 10 },
    snapshotFrozenP50Ms: { container: containers.frozen.p50Ms, microvm: vms.frozen.p50Ms, ratio: Math.round((vms.frozen.p50Ms / containers.frozen.p50Ms) * 10) / 10 },
    snapshotWrittenMiB: SNAPSHOT_MIB,
    hostMiBPerIdleMicroVm: Math.round((rssMiB.reduce((a, b) => a + b, 0) / rssMiB.length) * 10) / 10,
    guestMemoryMiB: 256,
    returnMemory,
  };
  console.log(JSON.stringify(result));
} finally {
  await cluster.stop();
}
