import fs from 'node:fs/promises';
import path from 'node:path';
import type { NetworkPolicy } from '../../api/index.ts';
import type { Accelerator } from './accelerator.ts';
import type { VmChannel } from './channel.ts';
import type { VmCommandTarget } from './exec.ts';
import type { PortWatch } from './port-watch.ts';

/** How QEMU was started: a restore starts it the same (the devices' saved state fits only those). */
export interface StartedWith {
  accelerator: Accelerator;
  vcpus: number;
  memoryMiB: number;
  /**
   * Its guest's multiplexer takes requests (snapshots, hidden paths, freezes: guest/requests.c).
   * A VM booted by an older worker's initramfs does not: pauses are QMP only, and the rest
   * answers tier_unsupported. Kept in a hibernation's image with the rest.
   */
  guestRequests?: boolean;
  /**
   * With a NIC (network mode allowlist at create), and a guest whose multiplexer takes a new
   * lease (MUX_NET): a wake gives it one on the waking host's lease.
   */
  nic?: boolean;
  /**
   * Its guest's multiplexer takes a name (MUX_IDENTITY) and its init a RELEASE of its
   * commands: its memory can be restored as a fork's children, each renamed.
   */
  guestIdentity?: boolean;
  /** With the virtio-balloon device that takes the guest's free page reports (qemu.ts returnMemory). */
  freePageReporting?: boolean;
}

/** What is kept on disk per sandbox so a restarted worker can adopt its VM. */
export interface VmFile {
  pid: number;
  /** Absent in the files of VMs started before hibernation existed. */
  started?: StartedWith;
  env: Record<string, string>;
  workdir: string;
  user?: string;
  /** Layer digests, base first. */
  layers: string[];
  /** Those read on demand (their blobs held in the host's chunk cache: lazy-blobs.ts). */
  lazyLayers?: string[];
  /** The current stage's network policy; `nic`: the VM was started with a NIC (mode allowlist at create). */
  network?: NetworkPolicy;
  nic?: boolean;
  /** The current stage's hidden paths (the guest's multiplexer keeps them hidden: guest/hide.c). */
  hiddenPaths?: string[];
  /**
   * Class besteffort: its VMM's own CPU quota, µs per period. The besteffort guard lowers it
   * while a latency command runs (besteffort-guard.ts); a worker adopting the VM restores it
   * (its predecessor may have died holding it).
   */
  besteffortQuotaUs?: number;
}

/** A running microVM on this host. */
export interface Vm extends VmCommandTarget {
  dir: string;
  file: VmFile;
  layers: string[];
  pid: number;
  channel: VmChannel;
  stopping: boolean;
  /** Its channel closed: QEMU exited or is exiting (it closes its sockets before its process ends). */
  channelClosed?: boolean;
  /** Pause, resume, stage changes, snapshots and hibernation of this VM, one at a time. */
  ops: Promise<unknown>;
  /** QEMU's word that the guest closed the channel's port (its multiplexer died): port-watch.ts. */
  portWatch?: PortWatch;
  guestLost?: boolean;
}

export const VM_FILE = 'vm.json';

export async function readVmFile(dir: string): Promise<VmFile | undefined> {
  try {
    return JSON.parse(await fs.readFile(path.join(dir, VM_FILE), 'utf8')) as VmFile;
  } catch {
    return undefined;
  }
}

export async function writeVmFile(vm: Pick<Vm, 'dir' | 'file'>): Promise<void> {
  await fs.writeFile(path.join(vm.dir, VM_FILE), JSON.stringify(vm.file));
}

/** Whether the guest takes requests to its trusted side (StartedWith.guestRequests). */
export function takesRequests(vm: Pick<Vm, 'file'>): boolean {
  return vm.file.started?.guestRequests === true;
}

/** `fn` after every operation queued on this VM before it (and before the next one). */
export function serially<T>(vm: Vm, fn: () => Promise<T>): Promise<T> {
  const run = vm.ops.catch(() => undefined).then(fn);
  vm.ops = run;
  return run;
}
