import { execFile } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { RollboxError } from '../../api/index.ts';
import { releaseCommands } from '../init/index.ts';
import type { SandboxRuntimeSpec } from '../runtime/index.ts';
import type { Accelerator } from './accelerator.ts';
import { inCgroupPrefix, makeVmCgroup, vmCgroupRel } from './cgroup.ts';
import { loadVm, readImage } from './hibernation.ts';
import type { VmLazyHolds } from './lazy-blobs.ts';
import { attachVmNetwork, nicPolicy, VM_TAP } from './net.ts';
import { monitorReady } from './qmp.ts';
import { startQemu } from './qemu.ts';
import { writeVmFile, type StartedWith, type Vm, type VmFile } from './vm.ts';
import { hidePaths, type VmOpsDeps } from './vm-ops.ts';
import type { SandboxNetworks } from '../network/index.ts';

const run = promisify(execFile);

/** How long a restored guest may take to apply its new address or name (the multiplexer answers at once; TCG on a loaded host is slow). */
const GUEST_CONTROL_TIMEOUT_MS = 15_000;

/** What starting a VM needs of its runtime (runtime.ts). */
export interface VmStartHost {
  qemuBinary: string;
  accelerator: Accelerator;
  kernel: string;
  initramfs: string;
  tscKhz?: number;
  ramDir: string;
  bootTimeoutMs: number;
  /** Guest memory handed back to the host (qemu.ts); undefined: off. */
  returnMemory?: { cacheReclaimSeconds: number };
  network?: SandboxNetworks;
  nodeId: string;
  dirOf(id: string): string;
  ramFileOf(id: string): string;
  lazyHolds: VmLazyHolds;
  /** Connects to a started QEMU's channel and monitors, and registers the VM. */
  adopt(id: string, file: VmFile): Promise<Vm>;
  /** A besteffort VM booted: its VMM's CPU quota is the besteffort guard's to hold back from now on. */
  besteffortStarted(id: string, quotaFile: string): void;
  ops: VmOpsDeps;
}

/** The guest's name: the container tier's (`rb-<id>`, at most 63 bytes), so both tiers name a sandbox alike. */
export function hostnameOf(sandboxId: string): string {
  return `rb-${sandboxId}`.slice(0, 63);
}

/**
 * Starts a VM: booted fresh, or restored from an image (a hibernation's, to wake the same
 * sandbox; a fork's, for a new child), then named, networked and given its hidden paths
 * before its first command. The caller removes what is left on failure.
 */
export async function startVm(host: VmStartHost, spec: SandboxRuntimeSpec): Promise<void> {
  const dir = host.dirOf(spec.sandboxId);
  const diskImage = path.join(dir, 'disk.ext4');
  const ramFile = host.ramFileOf(spec.sandboxId);
  const image = spec.restoreWhole ?? spec.restoreFork;
  let started: StartedWith;
  if (image) {
    // The RAM and disk as they were saved (copied: the image stays for other children); QEMU started as it was, waiting for its device state.
    started = await readImage<StartedWith>(image, { ramFile, diskImage });
    if (started.accelerator !== host.accelerator) throw new RollboxError('invalid_state', `sandbox ${spec.sandboxId}'s image was saved under ${started.accelerator} and this host runs ${host.accelerator}`);
    // A child's memory and vCPUs are the image's; the gateway refuses a fork that asks otherwise.
    if (spec.restoreFork && spec.resources.memoryMiB !== started.memoryMiB) throw new RollboxError('invalid_request', `a child of this fork has the parent's ${started.memoryMiB} MiB of memory, not ${spec.resources.memoryMiB}`);
  } else {
    // Sparse, formatted here before the guest ever sees it; the host never mounts it.
    await fs.writeFile(diskImage, '');
    await fs.truncate(diskImage, spec.resources.diskMiB * 1024 * 1024);
    await run('mkfs.ext4', ['-q', '-F', '-E', 'lazy_itable_init=1,lazy_journal_init=1', diskImage]);
    await fs.mkdir(host.ramDir, { recursive: true, mode: 0o700 });
    const vcpus = Math.min(os.availableParallelism(), Math.max(1, Math.ceil(spec.resources.cpuMillis / 1000)));
    started = { accelerator: host.accelerator, vcpus, memoryMiB: spec.resources.memoryMiB, guestRequests: true, guestIdentity: true, ...(host.returnMemory ? { freePageReporting: true } : {}) };
  }
  // Their lazy blobs marked before QEMU opens them.
  const lazyLayers = spec.layerImages.filter((l) => l.lazy).map((l) => l.digest);
  await host.lazyHolds.hold(spec.sandboxId, lazyLayers);
  // A restored VM gets the devices it was saved with: a NIC if it had one, on a lease of this
  // host (its current stage; none keeps the NIC, closed), whose address the guest takes below.
  const nic = image
    ? started.nic
      ? await attachVmNetwork(host.network, spec.sandboxId, nicPolicy(spec.network ?? { mode: 'none', allow: [] }))
      : undefined
    : await attachVmNetwork(host.network, spec.sandboxId, spec.network);
  if (nic) started = { ...started, nic: true };
  const cgroup = await makeVmCgroup(vmCgroupRel(host.nodeId, spec.sandboxId, spec.class), spec.resources, spec.class, started.vcpus);
  const child = startQemu(
    {
      qemuBinary: host.qemuBinary, accelerator: host.accelerator, kernel: host.kernel, initramfs: host.initramfs,
      layerImages: spec.layerImages.map((l) => ({ imagePath: l.imagePath, ...(l.blobPath ? { blobPath: l.blobPath } : {}) })), diskImage, ramFile, vcpus: started.vcpus, memoryMiB: started.memoryMiB,
      agentSocket: path.join(dir, 'agent.sock'), qmpSocket: path.join(dir, 'qmp.sock'), eventsSocket: path.join(dir, 'events.sock'), ...(host.tscKhz ? { tscKhz: host.tscKhz } : {}),
      ...(nic ? { nic: { netns: nic.netns, tap: VM_TAP, address: nic.address, gateway: nic.gateway } } : {}),
      pids: spec.resources.pids,
      // A restore gets the balloon device if it was saved with one (its state is in the image), whatever this host's setting.
      ...(started.freePageReporting ? { returnMemory: host.returnMemory ?? { cacheReclaimSeconds: 0 } } : {}),
      ...(image ? { incoming: true } : {}),
    },
    path.join(dir, 'console.log'),
    inCgroupPrefix(cgroup, spec.class),
  );
  if (!child.pid) throw new Error('QEMU did not start');
  const file: VmFile = { pid: child.pid, started, layers: spec.layerImages.map((l) => l.digest), env: spec.env, workdir: spec.workdir, ...(spec.user ? { user: spec.user } : {}), ...(spec.network ? { network: spec.network } : {}), ...(nic ? { nic: true } : {}), ...(lazyLayers.length ? { lazyLayers } : {}), ...(spec.class === 'besteffort' ? { besteffortQuotaUs: cgroup.ownQuotaUs } : {}) };
  await writeVmFile({ dir, file });
  const vm = await host.adopt(spec.sandboxId, file).catch(async (err: Error) => {
    throw new Error(`${err.message}; console: ${await consoleTail(dir)}`);
  });
  if (image) {
    await monitorReady(path.join(dir, 'qmp.sock'), host.bootTimeoutMs);
    await loadVm(path.join(dir, 'qmp.sock'), image);
  }
  await vm.channel.ready(host.bootTimeoutMs).catch(async (err: Error) => {
    throw new Error(`${err.message}; console: ${await consoleTail(dir)}`);
  });
  if (image) {
    // Its channels of before are gone, its clock stood still while it was saved, and its random
    // state is the saved one: set to now and reseeded (each child its own fresh entropy).
    vm.channel.restored();
    if (nic) await vm.channel.setNetwork(nic, GUEST_CONTROL_TIMEOUT_MS);
  }
  if (spec.restoreFork) {
    // The parent's memory: its name, and the parent's durable commands held by the init
    // (their callers wait on the parent). The child is renamed and its init lets go of them:
    // their processes run on, detached, their output dropped (docs/forks.md).
    await vm.channel.setIdentity({ hostname: hostnameOf(spec.sandboxId), pids: spec.resources.pids }, GUEST_CONTROL_TIMEOUT_MS);
    await releaseCommands(vm.initSocket);
  } else if (!image && started.guestIdentity) {
    await vm.channel.setIdentity({ hostname: hostnameOf(spec.sandboxId) }, GUEST_CONTROL_TIMEOUT_MS);
  }
  // The image stays for the fork's other children (the gateway removes it); a wake's goes once the VM runs.
  if (spec.restoreWhole) await fs.rm(spec.restoreWhole, { recursive: true, force: true });
  // Before the first command; after a wake, what a stage changed while it slept (the guest diffs).
  if (spec.hiddenPaths.length || image) await hidePaths(vm, spec.hiddenPaths, host.ops);
  cgroup.settle();
  if (spec.class === 'besteffort' && cgroup.cpuQuotaFile) host.besteffortStarted(spec.sandboxId, cgroup.cpuQuotaFile);
}

export async function consoleTail(dir: string): Promise<string> {
  const text = await fs.readFile(path.join(dir, 'console.log'), 'utf8').catch(() => '');
  return text.slice(-600).trim() || '(empty)';
}
