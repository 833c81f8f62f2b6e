import fs from 'node:fs/promises';
import path from 'node:path';
import { RollboxError } from '../../api/index.ts';
import { extractInThread, type TarExtractor } from '../../layers/index.ts';
import type { SandboxNetworks } from '../network/index.ts';
import type { BesteffortGuard, RuntimeLogger, SandboxRuntime, SandboxRuntimeSpec } from '../runtime/index.ts';
import type { Accelerator } from './accelerator.ts';
import { openVmChannel } from './channel.ts';
import { attachInVm, execInVm, execRawInVm } from './exec.ts';
import { removeVmCgroup, removeVmCgroupParents, vmCpuQuotaFile, vmMemoryHeld } from './cgroup.ts';
import { netnsPathOf, nicPolicy, releaseVmNetwork, VM_BRIDGE, vmNetnsOf } from './net.ts';
import { saveVm } from './hibernation.ts';
import { saveForkImage } from './fork-image.ts';
import { consoleTailOf, exitCauseFromConsole } from './exit-cause.ts';
import { VmLazyHolds, type LazyVmBlobs } from './lazy-blobs.ts';
import { watchGuestPort } from './port-watch.ts';
import { processAlive } from '../../proc/index.ts';
import { isQemuPid } from './qemu.ts';
import { startVm, type VmStartHost } from './start.ts';
import { readVmFile, serially, type Vm, type VmFile } from './vm.ts';
import { applyVmPolicy, pauseVm, resumeVm, snapshotOfVm, type VmOpsDeps } from './vm-ops.ts';


export interface MicroVmRuntimeDeps {
  /** Everything of this runtime lives here: one directory per sandbox (disk, sockets, console log). */
  dataDir: string;
  /** The VMMs' cgroups go under `rollbox-vm[-besteffort]/<nodeId>/` (cgroup.ts). */
  nodeId: string;
  qemuBinary: string;
  accelerator: Accelerator;
  kernel: string;
  initramfs: string;
  /** A tmpfs directory of this node's own, for the guests' RAM files (qemu.ts ramFile). */
  ramDir: string;
  /** Under TCG: the host's TSC (accelerator.ts hostTscKhz). */
  tscKhz?: number;
  /** From QEMU's start until the guest's init answers. */
  bootTimeoutMs: number;
  /** Guest memory handed back to the host: free page reporting, and the guest's cold page cache reclaimed this often (qemu.ts); undefined: off. */
  returnMemory?: { cacheReclaimSeconds: number };
  /** Sandbox networking, shared with the container runtime (one pool, one host table); without it only mode none. */
  network?: SandboxNetworks;
  /** Reads a snapshot's tar into its EROFS layer (the worker's extraction threads); default: this thread. */
  extract?: TarExtractor;
  /** A snapshot whose guest sends nothing for this long is given up (snapshot_failed). */
  snapshotIdleTimeoutMs: number;
  /** The host's lazy layers (a host without the layer store): a VM's QEMU reads their blobs through the gate. */
  lazy?: LazyVmBlobs;
  /**
   * The host's besteffort guard, shared with its containers: a latency VM's waited-on command
   * holds besteffort sandboxes of either tier back, and besteffort VMs are held with them.
   */
  besteffortGuard?: Pick<BesteffortGuard, 'hold' | 'started' | 'addQuotaFiles'>;
  logger?: RuntimeLogger;
}

/** What a microVM cannot do yet: the coded error, naming the tier. */
export function unsupported(what: string): RollboxError {
  return new RollboxError('tier_unsupported', `the microvm tier cannot ${what} yet (docs/microvm.md)`);
}

/** The guest kernel and its initramfs need this much guest memory to boot. */
export const MIN_GUEST_MEMORY_MIB = 128;

export interface MicroVmRuntime extends SandboxRuntime {
  readonly accelerator: Accelerator;
  has(sandboxId: string): boolean;
  /** The VMM's pid (tests: a VMM killed from outside). */
  pidOf(sandboxId: string): number | undefined;
}

/**
 * The microVM tier: per sandbox one QEMU `-M microvm` (accelerator chosen at start), its
 * layers as read-only virtio-blk, its own ext4 disk (made here, never mounted on the host),
 * and rollbox-init as the guest's PID 1 reached over a multiplexed virtio-serial channel.
 * vCPUs from cpuMillis (whole CPUs, rounded up), guest memory = the memory limit.
 */
export function createMicroVmRuntime(deps: MicroVmRuntimeDeps): MicroVmRuntime {
  const vms = new Map<string, Vm>();
  const ops: VmOpsDeps = { extract: deps.extract ?? extractInThread, snapshotIdleTimeoutMs: deps.snapshotIdleTimeoutMs, unsupported, ...(deps.network ? { network: deps.network } : {}), ...(deps.logger ? { logger: deps.logger } : {}) };
  let exitListener: ((id: string) => void) | undefined;
  const lazyHolds = new VmLazyHolds(deps.lazy);
  const dirOf = (id: string): string => path.join(deps.dataDir, id);
  const ramFileOf = (id: string): string => path.join(deps.ramDir, `${id}.ram`);
  const vmOf = (id: string): Vm => {
    const vm = vms.get(id);
    if (!vm) throw new RollboxError('not_found', `sandbox ${id} is not on this host`);
    return vm;
  };
  const watch = (id: string, vm: Vm): void => {
    void vm.channel.closed.then(() => {
      vm.channelClosed = true;
      if (vms.get(id) === vm && !vm.stopping) exitListener?.(id);
    });
  };
  const kill = async (pid: number): Promise<void> => {
    if (!isQemuPid(pid, deps.qemuBinary)) return;
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      return;
    }
    for (let i = 0; i < 200 && isQemuPid(pid, deps.qemuBinary); i++) await new Promise((r) => setTimeout(r, 10));
  };
  const remove = async (id: string): Promise<void> => {
    const dir = dirOf(id);
    const vm = vms.get(id);
    if (vm) {
      vm.stopping = true;
      vm.portWatch?.close();
      await vm.channel.close();
    }
    const file = await readVmFile(dir);
    if (file) await kill(file.pid);
    if (vm) await kill(vm.pid);
    vms.delete(id);
    besteffortQuotas.delete(id);
    await lazyHolds.release(id);
    // QEMU is gone, so is every user of the namespace: veth, lease, chain, then the namespace.
    await releaseVmNetwork(deps.network, id);
    await removeVmCgroup(deps.nodeId, id);
    await fs.rm(dir, { recursive: true, force: true });
    await fs.rm(ramFileOf(id), { force: true });
    await fs.rmdir(deps.ramDir).catch(() => undefined); // only once empty: the last VM's file went
  };
  const adopt = async (id: string, file: VmFile): Promise<Vm> => {
    const dir = dirOf(id);
    const channel = await openVmChannel(path.join(dir, 'agent.sock'), path.join(dir, 'init.sock'), { connectTimeoutMs: deps.bootTimeoutMs, vmmAlive: () => processAlive(file.pid) });
    const vm: Vm = { sandboxId: id, dir, file, layers: file.layers, pid: file.pid, channel, stopping: false, initSocket: channel.initSocket, env: file.env, workdir: file.workdir, ...(file.user ? { user: file.user } : {}), live: new Map(), ops: Promise.resolve() };
    vms.set(id, vm);
    watch(id, vm);
    // The guest's multiplexer gone with QEMU running: the sandbox has lost its init (checkAlive), and its commands their channel.
    vm.portWatch = watchGuestPort(path.join(dir, 'events.sock'), () => {
      vm.guestLost = true;
      void vm.channel.close();
    });
    return vm;
  };

  // Besteffort VMs once booted (the boot runs at a full CPU per vCPU: cgroup.ts), by the quota file of their VMM's cgroup.
  const besteffortQuotas = new Map<string, string>();
  deps.besteffortGuard?.addQuotaFiles(() => [...besteffortQuotas.values()]);
  const besteffortStarted = (id: string, quotaFile: string): void => {
    besteffortQuotas.set(id, quotaFile);
    deps.besteffortGuard?.started(quotaFile);
  };
  const startHost: VmStartHost = { ...deps, dirOf, ramFileOf, lazyHolds, adopt, ops, besteffortStarted };

  return {
    accelerator: deps.accelerator,
    has: (id) => vms.has(id),
    pidOf: (id) => vms.get(id)?.pid,
    async create(spec: SandboxRuntimeSpec) {
      if (vms.has(spec.sandboxId)) return;
      if (spec.restoreUpper) throw unsupported('wake a sandbox hibernated as its writable layer');
      if (spec.lowPriority) throw unsupported('keep warm pools');
      if (spec.resources.memoryMiB < MIN_GUEST_MEMORY_MIB) throw unsupported(`boot with less than ${MIN_GUEST_MEMORY_MIB} MiB of memory (resources.memoryMiB)`);
      const dir = dirOf(spec.sandboxId);
      await fs.rm(dir, { recursive: true, force: true });
      await fs.mkdir(dir, { recursive: true, mode: 0o700 });
      try {
        await startVm(startHost, spec);
      } catch (err) {
        await remove(spec.sandboxId);
        if (err instanceof RollboxError) throw err;
        throw new RollboxError('internal', `microVM ${spec.sandboxId} did not start: ${(err as Error).message}`);
      }
    },
    async exec(id, spec) {
      const vm = vmOf(id);
      // The guest's init would allocate it; the host side (resize, a session's output tail) is not wired for VMs yet.
      if (spec.pty) throw unsupported('run a command on a pty (use tier container)');
      // A caller waits on a latency VM's command: the host's besteffort sandboxes are held back meanwhile (besteffort-guard.ts).
      const release = spec.holdBackBesteffort && vm.file.besteffortQuotaUs === undefined ? deps.besteffortGuard?.hold() : undefined;
      if (!release) return execInVm(vm, spec);
      // Let go as the command ends, before its result is recorded (and its caller answered).
      const record = spec.record;
      try {
        return await execInVm(vm, { ...spec, record: async (outcome) => (release(), await record?.(outcome)) });
      } finally {
        release();
      }
    },
    execRaw: (id, spec) => execRawInVm(vmOf(id), spec),
    attach: (id, spec) => attachInVm(vmOf(id), spec),
    async signalCommand(id, commandId, signo) {
      const channel = await vms.get(id)?.live.get(commandId)?.opened;
      channel?.signal(signo);
      return channel !== undefined;
    },
    resizeCommand: async () => false,
    async writeCommandStdin(id, commandId, data, eof) {
      const live = vms.get(id)?.live.get(commandId);
      if (!live?.stdinOpen) return false;
      if (eof) live.stdinOpen = false;
      const channel = await live.opened;
      if (!channel) return false;
      if (data.length) await channel.writeStdin(data);
      if (eof) channel.closeStdin();
      return true;
    },
    claim: async () => {
      throw unsupported('take a sandbox from a warm pool');
    },
    destroy: (id) => remove(id),
    applyPolicy: (id, change) => applyVmPolicy(vmOf(id), change, ops),
    // The sandbox frozen in the guest, then the whole VM stopped (every vCPU; QEMU keeps its memory): vm-ops.ts.
    pause: (id) => pauseVm(vmOf(id), ops),
    // A VM's memory is its QEMU's (its cgroup); of its guest's RAM, what the RAM file does not hold is not backed by the host.
    memoryHeld: async () => {
      const held = await vmMemoryHeld(deps.nodeId);
      const unbacked = await Promise.all(
        [...vms.values()].map(async (vm) => {
          const started = vm.file.started;
          if (!started?.freePageReporting) return 0;
          const ram = await fs.stat(ramFileOf(vm.sandboxId)).catch(() => undefined);
          return ram ? Math.max(0, started.memoryMiB * 1024 * 1024 - ram.blocks * 512) : 0;
        }),
      );
      return { ...held, guestUnbackedBytes: unbacked.reduce((sum, b) => sum + b, 0) };
    },
    // A VM's memory is QEMU's: its guest would need to page it out (or the host swap QEMU's process).
    swapOut: async () => {
      throw new RollboxError('tier_unsupported', 'pause mode swap is for containers; a microVM pauses with freeze or hibernates whole');
    },
    resume: (id) => resumeVm(vmOf(id)),
    snapshot: (id, options) => snapshotOfVm(vmOf(id), options, ops),
    // A VM's disk is not on the scratch filesystem: a fork packs its writable layer (snapshot) instead.
    makeForkPoint: async () => undefined,
    packForkPoint: async () => {
      throw unsupported('pack a fork point');
    },
    removeForkPoint: () => undefined,
    hibernatesWhole: (id) => vms.has(id),
    hibernateWhole: (id, imageDir) => serially(vmOf(id), async () => {
      const vm = vmOf(id);
      if (!vm.file.started) throw unsupported('hibernate a VM started by an older worker (its RAM is not a shared file)');
      // Its guest could not take a new lease at the wake (its multiplexer predates MUX_NET, kind 12 since the guest's requests took 8 to 11).
      if (vm.file.nic && !(vm.file.started.nic && vm.file.started.guestRequests)) throw unsupported('hibernate a VM with a network device started by an older worker');
      // Its running commands are let go of, not ended: they run on in the saved guest, whose
      // init keeps their output and result for the host that wakes it (the caller carries them there).
      const carried = [...vm.live.entries()];
      for (const [, live] of carried) live.released = true;
      try {
        await saveVm({ qmpSocket: path.join(vm.dir, 'qmp.sock'), ramFile: ramFileOf(id), diskImage: path.join(vm.dir, 'disk.ext4'), startedWith: vm.file.started }, imageDir);
      } catch (err) {
        for (const [, live] of carried) live.released = false;
        throw err;
      }
      await remove(id);
      return { carriedCommands: carried.map(([commandId]) => commandId) };
    }),
    // A fork's image: the VM saved as a hibernation saves it, and running on (fork-image.ts).
    forkWhole: (id, imageDir, children) => serially(vmOf(id), async () => {
      const vm = vmOf(id);
      // A child is renamed and lets go of its commands before its first one (MUX_IDENTITY and the init's RELEASE, since this worker).
      if (!vm.file.started?.guestIdentity) throw unsupported('fork the processes of a VM started by an older worker (a fork with processes: false copies its files)');
      if (vm.file.nic && !vm.file.started.nic) throw unsupported('fork the processes of a VM with a network device started by an older worker');
      // A virtio-mmio NIC cannot be added to a restored machine (as to a running one).
      if (children.nic && !vm.file.nic) throw unsupported('give a network to the children of a VM created without one (network.mode none at create): fork with processes: false for a fresh VM with a NIC');
      const detachedCommands = [...vm.live.keys()];
      const saved = await saveForkImage({ qmpSocket: path.join(vm.dir, 'qmp.sock'), ramFile: ramFileOf(id), diskImage: path.join(vm.dir, 'disk.ext4'), startedWith: vm.file.started, stagingDir: deps.ramDir }, imageDir);
      return { ...saved, detachedCommands };
    }),
    async isRunning(id) {
      const vm = vms.get(id);
      // A guest that reset (a panic) has QEMU close its sockets and clean up before its process ends: the closed channel says it first;
      // a guest that closed its port (its multiplexer killed) is lost with QEMU still running.
      return vm !== undefined && !vm.channelClosed && !vm.guestLost && isQemuPid(vm.pid, deps.qemuBinary);
    },
    onExit(listener) {
      exitListener = listener;
    },
    detach() {
      exitListener = undefined;
      for (const vm of vms.values()) {
        vm.stopping = true;
        vm.portWatch?.close(); // QEMU serves one client per monitor: the next worker's
        void vm.channel.close();
      }
      vms.clear();
    },
    oomKillCount: async () => 0,
    // Its guest kernel's last words on the console: a panic, an OOM with nothing left to kill, a reset, or none (killed from outside).
    exitCause: async (id) => exitCauseFromConsole(await consoleTailOf(path.join(dirOf(id), 'console.log'))),
    async reconcile(keep) {
      const adopted: string[] = [];
      const removed: string[] = [];
      const entries = await fs.readdir(deps.dataDir).catch(() => [] as string[]);
      for (const id of entries) {
        if (vms.has(id) && keep.has(id)) continue;
        const file = await readVmFile(dirOf(id));
        if (keep.has(id) && file && isQemuPid(file.pid, deps.qemuBinary) && (await lazyHolds.adopt(id, file.lazyLayers ?? []))) {
          try {
            await adopt(id, file);
            const quotaFile = file.besteffortQuotaUs !== undefined ? await vmCpuQuotaFile(deps.nodeId, id, 'besteffort') : undefined;
            if (quotaFile) {
              // Its own quota again: a worker that died during a hold left it held.
              await fs.writeFile(quotaFile, String(file.besteffortQuotaUs)).catch((err: unknown) => deps.logger?.warn({ sandboxId: id, err: String(err) }, 'could not restore the CPU quota of an adopted besteffort microVM'));
              besteffortQuotas.set(id, quotaFile);
            }
            if (file.nic && file.network) await deps.network?.adopt(id, netnsPathOf(vmNetnsOf(id)), nicPolicy(file.network), { bridge: VM_BRIDGE });
            adopted.push(id);
            continue;
          } catch (err) {
            deps.logger?.warn({ sandboxId: id, err: (err as Error).message }, 'microVM not adoptable');
          }
        }
        await remove(id);
        removed.push(id);
      }
      // RAM files whose VM is gone (a worker that died between a QEMU's end and its cleanup).
      for (const name of await fs.readdir(deps.ramDir).catch(() => [] as string[])) {
        if (!vms.has(name.replace(/\.ram$/, ''))) await fs.rm(path.join(deps.ramDir, name), { force: true });
      }
      if (vms.size === 0) await removeVmCgroupParents(deps.nodeId);
      // Sandboxes this runtime does not know are the container runtime's to report.
      return { adopted, removed, missing: [] };
    },
    mountedLayers: () => [],
    sandboxesUsingLayers: (digests) => [...vms.values()].filter((vm) => vm.layers.some((d) => digests.has(d))).map((vm) => vm.sandboxId),
    unmountUnused: async () => {},
    diskSpace: () => ({ sizeMiB: 0, freeMiB: 0, preallocated: false }),
    // Its guest's use is inside the guest: the host sees one VMM process, not the sandbox's figures.
    metrics: async (id) => {
      throw new RollboxError('tier_unsupported', `sandbox ${id} is a microVM: its metrics (CPU, memory, disk inside the guest) are not read yet`);
    },
    // Its ports are the guest kernel's: the host cannot connect to them from a namespace.
    netnsPidOf: async (id) => {
      throw new RollboxError('tier_unsupported', `sandbox ${id} is a microVM: traffic into its ports is not proxied yet`);
    },
  };
}
