import { execFile } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { RollboxError } from '../../api/index.ts';
import { extractInThread, type TarExtractor } from '../../layers/index.ts';
import type { SandboxNetworks } from '../network/index.ts';
import type { RuntimeLogger, SandboxRuntime, SandboxRuntimeSpec } from '../runtime/index.ts';
import type { Accelerator } from './accelerator.ts';
import { openVmChannel } from './channel.ts';
import { attachInVm, execInVm, execRawInVm } from './exec.ts';
import { inCgroupPrefix, makeVmCgroup, removeVmCgroup, removeVmCgroupParents, vmCgroupRel } from './cgroup.ts';
import { attachVmNetwork, netnsPathOf, nicPolicy, releaseVmNetwork, VM_BRIDGE, VM_TAP, vmNetnsOf } from './net.ts';
import { loadVm, readImage, saveVm } from './hibernation.ts';
import { consoleTailOf, exitCauseFromConsole } from './exit-cause.ts';
import { VmLazyHolds, type LazyVmBlobs } from './lazy-blobs.ts';
import { watchGuestPort } from './port-watch.ts';
import { isQemuPid, startQemu } from './qemu.ts';
import { readVmFile, serially, writeVmFile, type StartedWith, type Vm, type VmFile } from './vm.ts';
import { applyVmPolicy, hidePaths, pauseVm, resumeVm, snapshotOfVm, type VmOpsDeps } from './vm-ops.ts';

const run = promisify(execFile);

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
  /** Sandbox networking, shared with the container runtime (one pool, one host table); without it only mode none. */
  network?: SandboxNetworks;
  /** Reads a snapshot's tar into its EROFS layer (the worker's extraction threads); default: this thread. */
  extract?: TarExtractor;
  /** A snapshot whose guest sends nothing for this long is given up (snapshot_failed). */
  snapshotIdleTimeoutMs: number;
  /** The host's lazy layers (a host without the layer store): a VM's QEMU reads their blobs through the gate. */
  lazy?: LazyVmBlobs;
  logger?: RuntimeLogger;
}

/** What a microVM cannot do yet: the coded error, naming the tier. */
export function unsupported(what: string): RollboxError {
  return new RollboxError('tier_unsupported', `the microvm tier cannot ${what} yet (docs/microvm.md)`);
}

/** The guest kernel and its initramfs need this much guest memory to boot. */
export const MIN_GUEST_MEMORY_MIB = 128;

/** How long a woken guest may take to apply its new address (the multiplexer answers at once; TCG on a loaded host is slow). */
const WAKE_NETWORK_TIMEOUT_MS = 15_000;

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
    const channel = await openVmChannel(path.join(dir, 'agent.sock'), path.join(dir, 'init.sock'), 2000);
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
        const diskImage = path.join(dir, 'disk.ext4');
        const ramFile = ramFileOf(spec.sandboxId);
        let started: StartedWith;
        if (spec.restoreWhole) {
          // The RAM and disk as they were saved; QEMU started as it was, waiting for its device state.
          started = await readImage<StartedWith>(spec.restoreWhole, { ramFile, diskImage });
          if (started.accelerator !== deps.accelerator) throw new RollboxError('invalid_state', `sandbox ${spec.sandboxId} was saved under ${started.accelerator} and this host runs ${deps.accelerator}`);
        } else {
          // Sparse, formatted here before the guest ever sees it; the host never mounts it.
          await fs.writeFile(diskImage, '');
          await fs.truncate(diskImage, spec.resources.diskMiB * 1024 * 1024);
          await run('mkfs.ext4', ['-q', '-F', '-E', 'lazy_itable_init=1,lazy_journal_init=1', diskImage]);
          await fs.mkdir(deps.ramDir, { recursive: true, mode: 0o700 });
          started = { accelerator: deps.accelerator, vcpus: Math.min(os.availableParallelism(), Math.max(1, Math.ceil(spec.resources.cpuMillis / 1000))), memoryMiB: spec.resources.memoryMiB, guestRequests: true };
        }
        // Their lazy blobs marked before QEMU opens them.
        const lazyLayers = spec.layerImages.filter((l) => l.lazy).map((l) => l.digest);
        await lazyHolds.hold(spec.sandboxId, lazyLayers);
        // A woken VM gets the devices it was saved with: a NIC if it had one, on a lease of this host
        // (its current stage; none keeps the NIC, closed), whose address the guest takes below.
        const nic = spec.restoreWhole
          ? started.nic
            ? await attachVmNetwork(deps.network, spec.sandboxId, nicPolicy(spec.network ?? { mode: 'none', allow: [] }))
            : undefined
          : await attachVmNetwork(deps.network, spec.sandboxId, spec.network);
        if (nic) started = { ...started, nic: true };
        const cgroup = await makeVmCgroup(vmCgroupRel(deps.nodeId, spec.sandboxId, spec.class), spec.resources, spec.class, started.vcpus);
        const child = startQemu(
          {
            qemuBinary: deps.qemuBinary, accelerator: deps.accelerator, kernel: deps.kernel, initramfs: deps.initramfs,
            layerImages: spec.layerImages.map((l) => ({ imagePath: l.imagePath, ...(l.blobPath ? { blobPath: l.blobPath } : {}) })), diskImage, ramFile, vcpus: started.vcpus, memoryMiB: started.memoryMiB,
            agentSocket: path.join(dir, 'agent.sock'), qmpSocket: path.join(dir, 'qmp.sock'), eventsSocket: path.join(dir, 'events.sock'), ...(deps.tscKhz ? { tscKhz: deps.tscKhz } : {}),
            ...(nic ? { nic: { netns: nic.netns, tap: VM_TAP, address: nic.address, gateway: nic.gateway } } : {}),
            pids: spec.resources.pids,
            ...(spec.restoreWhole ? { incoming: true } : {}),
          },
          path.join(dir, 'console.log'),
          inCgroupPrefix(cgroup, spec.class),
        );
        if (!child.pid) throw new Error('QEMU did not start');
        const file: VmFile = { pid: child.pid, started, layers: spec.layerImages.map((l) => l.digest), env: spec.env, workdir: spec.workdir, ...(spec.user ? { user: spec.user } : {}), ...(spec.network ? { network: spec.network } : {}), ...(nic ? { nic: true } : {}), ...(lazyLayers.length ? { lazyLayers } : {}) };
        await writeVmFile({ dir, file });
        const vm = await adopt(spec.sandboxId, file).catch(async (err: Error) => {
          throw new Error(`${err.message}; console: ${await consoleTail(dir)}`);
        });
        if (spec.restoreWhole) await loadVm(path.join(dir, 'qmp.sock'), spec.restoreWhole);
        await vm.channel.ready(deps.bootTimeoutMs).catch(async (err: Error) => {
          throw new Error(`${err.message}; console: ${await consoleTail(dir)}`);
        });
        if (spec.restoreWhole) {
          // Its channels of before are gone, its clock stood still while it was saved, and its random state is the saved one.
          vm.channel.restored();
          if (nic) await vm.channel.setNetwork(nic, WAKE_NETWORK_TIMEOUT_MS);
          await fs.rm(spec.restoreWhole, { recursive: true, force: true });
        }
        // Before the first command; after a wake, what a stage changed while it slept (the guest diffs).
        if (spec.hiddenPaths.length || spec.restoreWhole) await hidePaths(vm, spec.hiddenPaths, ops);
        cgroup.settle();
      } catch (err) {
        await remove(spec.sandboxId);
        if (err instanceof RollboxError) throw err;
        throw new RollboxError('internal', `microVM ${spec.sandboxId} did not start: ${(err as Error).message}`);
      }
    },
    exec: (id, spec) => execInVm(vmOf(id), spec),
    execRaw: (id, spec) => execRawInVm(vmOf(id), spec),
    attach: (id, spec) => attachInVm(vmOf(id), spec),
    async signalCommand(id, commandId, signo) {
      const live = vms.get(id)?.live.get(commandId);
      if (!live) return false;
      live.channel.signal(signo);
      return true;
    },
    async writeCommandStdin(id, commandId, data, eof) {
      const live = vms.get(id)?.live.get(commandId);
      if (!live?.stdinOpen) return false;
      if (data.length) await live.channel.writeStdin(data);
      if (eof) {
        live.stdinOpen = false;
        live.channel.closeStdin();
      }
      return true;
    },
    claim: async () => {
      throw unsupported('take a sandbox from a warm pool');
    },
    destroy: (id) => remove(id),
    applyPolicy: (id, change) => applyVmPolicy(vmOf(id), change, ops),
    // The sandbox frozen in the guest, then the whole VM stopped (every vCPU; QEMU keeps its memory): vm-ops.ts.
    pause: (id) => pauseVm(vmOf(id), ops),
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
      // A command's caller waits on this host's connection, which the save ends; its processes would be kept, its result not.
      if (vm.live.size) throw new RollboxError('invalid_state', `sandbox ${id} has ${vm.live.size} command(s) running (${[...vm.live.keys()].slice(0, 3).join(', ')}); a microVM hibernates whole between commands (processes they left running in the background are kept)`);
      await saveVm({ qmpSocket: path.join(vm.dir, 'qmp.sock'), ramFile: ramFileOf(id), diskImage: path.join(vm.dir, 'disk.ext4'), startedWith: vm.file.started }, imageDir);
      await remove(id);
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
  };
}

async function consoleTail(dir: string): Promise<string> {
  const text = await fs.readFile(path.join(dir, 'console.log'), 'utf8').catch(() => '');
  return text.slice(-600).trim() || '(empty)';
}
