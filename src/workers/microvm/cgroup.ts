import { existsSync, mkdirSync, rmdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { Resources, SandboxClass } from '../../api/index.ts';
import { memoryHeldUnderParents, type MemoryHeld } from '../../swap/index.ts';
import { discoverCgroups, killCgroup, removeCgroupTree, type CgroupHierarchies } from '../runtime/cgroups.ts';
import { CPU_PERIOD_US, cpuShares } from '../runtime/spec.ts';

/**
 * Top-level trees of the VMMs' cgroups, apart from the container runtime's (`rollbox/`,
 * `rollbox-besteffort/`), whose reconcile removes every cgroup there it did not adopt.
 * The besteffort tree's cpu cgroup is idle, as the container tier's is.
 */
export const VM_CGROUP_ROOT = 'rollbox-vm';
export const VM_BESTEFFORT_CGROUP_ROOT = 'rollbox-vm-besteffort';

/**
 * Host memory a VMM needs beyond its guest's RAM: QEMU's own heap and mappings, the TCG
 * translation buffer (capped by `TCG_TB_MIB`), device buffers. Measured in
 * test/microvm-cgroup.test.ts (peak memory.max_usage_in_bytes of the cgroup with the
 * guest's RAM touched); see docs/microvm.md.
 */
export const VMM_OVERHEAD_MIB = 160;
/** The TCG translation buffer (`-accel tcg,tb-size=`): QEMU 7.2's default is 1 GiB, too much to charge a sandbox. */
export const TCG_TB_MIB = 64;
/**
 * The TCG translation buffer of a VM that hands memory back (ROLLBOX_VM_RETURN_MEMORY=on):
 * every page of the buffer the translator once wrote stays resident (46 of 64 MiB in an idle
 * VM after its boot). 32 MiB still holds the guest's hot code; 16 and 8 did not (the guest
 * retranslated all the time: forked children answered 3-7 s late, a snapshot test's guest
 * loop ran 3x slower). Measured in docs/microvm.md.
 */
export const TCG_TB_RETURN_MEMORY_MIB = 32;
/** Threads of one QEMU (vCPUs, I/O, RCU, the block layer's worker pool, which grows to 64): its pids limit, beyond its vCPUs. */
export const VMM_PIDS = 96;

/** Where one VMM's cgroup is, the same relative path in every v1 hierarchy. */
export function vmCgroupRel(nodeId: string, sandboxId: string, cls: SandboxClass): string {
  return `${cls === 'besteffort' ? VM_BESTEFFORT_CGROUP_ROOT : VM_CGROUP_ROOT}/${nodeId}/vm-${sandboxId}`;
}

export interface VmCgroup {
  /** The directories QEMU's pid is written to (cgroup.procs) before it execs. */
  dirs: string[];
  /** Once the guest answers: the sandbox's own CPU quota (the boot ran at its vCPUs' full quota). */
  settle(): void;
  /** The VMM's cpu.cfs_quota_us (none without a cpu hierarchy), and the sandbox's own quota there after the boot. */
  cpuQuotaFile?: string;
  ownQuotaUs: number;
}

let hierarchies: Promise<CgroupHierarchies> | undefined;
const cgroups = () => (hierarchies ??= discoverCgroups());

/**
 * The VMM's cgroup with the sandbox's limits: CPU quota from cpuMillis (the guest's vCPUs
 * and QEMU's own threads share it; during the boot at least one full CPU per vCPU, since a
 * guest kernel booting under TCG at 10 millicores would take many minutes, set back by
 * `settle`), shares as a container's, memory = guest RAM + the
 * measured overhead (swap included where the host accounts it), pids for QEMU's threads.
 */
export async function makeVmCgroup(rel: string, resources: Resources, cls: SandboxClass, vcpus: number): Promise<VmCgroup> {
  const h = await cgroups();
  const memory = path.join(h.memory, rel);
  const pids = path.join(h.pids, rel);
  const cpu = h.cpu ? path.join(h.cpu, rel) : undefined;
  const dirs = [memory, pids, ...(cpu ? [cpu] : [])];
  if (cls === 'besteffort' && h.cpu) {
    const root = path.join(h.cpu, VM_BESTEFFORT_CGROUP_ROOT);
    mkdirSync(root, { recursive: true });
    if (existsSync(path.join(root, 'cpu.idle'))) writeFileSync(path.join(root, 'cpu.idle'), '1');
  }
  for (const d of dirs) mkdirSync(d, { recursive: true });
  const limit = String((resources.memoryMiB + VMM_OVERHEAD_MIB) * 1024 * 1024);
  writeFileSync(path.join(memory, 'memory.limit_in_bytes'), limit);
  if (h.memsw) writeFileSync(path.join(memory, 'memory.memsw.limit_in_bytes'), limit);
  writeFileSync(path.join(pids, 'pids.max'), String(VMM_PIDS + vcpus));
  if (cpu) {
    writeFileSync(path.join(cpu, 'cpu.cfs_period_us'), String(CPU_PERIOD_US));
    writeFileSync(path.join(cpu, 'cpu.cfs_quota_us'), String(Math.max(resources.cpuMillis, vcpus * 1000) * (CPU_PERIOD_US / 1000)));
    writeFileSync(path.join(cpu, 'cpu.shares'), String(cpuShares(resources, cls)));
  }
  const ownQuotaUs = resources.cpuMillis * (CPU_PERIOD_US / 1000);
  const settle = () => {
    if (cpu) writeFileSync(path.join(cpu, 'cpu.cfs_quota_us'), String(ownQuotaUs));
  };
  return { dirs, settle, ownQuotaUs, ...(cpu ? { cpuQuotaFile: path.join(cpu, 'cpu.cfs_quota_us') } : {}) };
}

/** The cpu.cfs_quota_us of a VMM's cgroup (a VM adopted after a restart), if the host has the cpu hierarchy. */
export async function vmCpuQuotaFile(nodeId: string, sandboxId: string, cls: SandboxClass): Promise<string | undefined> {
  const { cpu } = await cgroups();
  return cpu ? path.join(cpu, vmCgroupRel(nodeId, sandboxId, cls), 'cpu.cfs_quota_us') : undefined;
}

/**
 * The VMM's cgroup in every hierarchy (either class), after killing whatever is still in
 * it: a QEMU the pid checks missed (killed while its `sh` prefix had not exec'd yet) goes
 * too. Best effort, idempotent.
 */
export async function removeVmCgroup(nodeId: string, sandboxId: string): Promise<void> {
  const h = await cgroups();
  for (const cls of ['latency', 'besteffort'] as const) {
    const rel = vmCgroupRel(nodeId, sandboxId, cls);
    if (existsSync(path.join(h.pids, rel))) await killCgroup(path.join(h.pids, rel), undefined);
    for (const root of [h.memory, h.pids, h.cpu]) {
      // A just-emptied memory cgroup can stay busy for a moment (offlining).
      for (let tries = 0; root && !removeCgroupTree(path.join(root, rel)) && tries < 40; tries++) await new Promise((r) => setTimeout(r, 25));
    }
  }
}

/** What this node's VMMs hold in the host's memory and in swap together (their node parents' hierarchical totals). */
export async function vmMemoryHeld(nodeId: string): Promise<MemoryHeld> {
  return memoryHeldUnderParents((await cgroups()).memory, [VM_CGROUP_ROOT, VM_BESTEFFORT_CGROUP_ROOT].map((tree) => `${tree}/${nodeId}`));
}

/** With no VM left on this worker (reconcile): its node's parents, and the trees when no other worker has VMs in them. */
export async function removeVmCgroupParents(nodeId: string): Promise<void> {
  const h = await cgroups();
  for (const root of [h.memory, h.pids, h.cpu]) {
    for (const tree of [VM_CGROUP_ROOT, VM_BESTEFFORT_CGROUP_ROOT]) {
      if (!root) continue;
      removeCgroupTree(path.join(root, tree, nodeId));
      try {
        rmdirSync(path.join(root, tree));
      } catch {
        // another worker's VMs are in it, or it is gone
      }
    }
  }
}

/**
 * A command prefix that puts itself in `cgroup` and then execs the rest (so every byte and
 * thread QEMU ever has is charged there), under SCHED_IDLE for besteffort like a container's init.
 */
export function inCgroupPrefix(cgroup: VmCgroup, cls: SandboxClass): string[] {
  const script = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1/cgroup.procs" || exit 1; shift; n=$((n-1)); done; exec "$@"';
  return ['sh', '-c', script, 'rollbox-vmm', String(cgroup.dirs.length), ...cgroup.dirs, ...(cls === 'besteffort' ? ['chrt', '--idle', '0'] : [])];
}
