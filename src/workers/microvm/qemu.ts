import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import type { Accelerator } from './accelerator.ts';
import { TCG_TB_MIB, TCG_TB_RETURN_MEMORY_MIB } from './cgroup.ts';
import { netnsPathOf } from './net.ts';
import { GUEST_PORT_ID } from './port-watch.ts';

/** One microVM's QEMU command line, from the sandbox's disks and limits. */
export interface QemuSpec {
  qemuBinary: string;
  accelerator: Accelerator;
  kernel: string;
  initramfs: string;
  /** The EROFS layer images, base first (read-only virtio-blk, serials rbl0, rbl1, ...), a split layer's data blob beside its image (serial rbl<i>b). */
  layerImages: { imagePath: string; blobPath?: string }[];
  /** The sandbox's ext4 writable disk (serial rbdisk). */
  diskImage: string;
  vcpus: number;
  memoryMiB: number;
  /**
   * The guest's RAM: a shared file on a tmpfs, so a hibernation saves only the devices'
   * state through QEMU (migration with x-ignore-shared) and copies the RAM file as it is.
   */
  ramFile: string;
  /** Started to restore a hibernated VM: paused, waiting for its device state (`migrate-incoming`). */
  incoming?: boolean;
  agentSocket: string;
  qmpSocket: string;
  /** A second QMP monitor, kept open by the worker for events (port-watch.ts). */
  eventsSocket?: string;
  /** Under TCG: the guest's early TSC calibration (without it boots hang at PIT calibration). */
  tscKhz?: number;
  /**
   * A NIC (network mode allowlist): virtio-net on the tap of the sandbox's namespace, which
   * QEMU is started in; the guest's init takes the address and gateway from the command line.
   */
  nic?: { netns: string; tap: string; address: string; gateway: string };
  /** The sandbox's pids limit, applied inside the guest by its init (guest/limits.c). */
  pids?: number;
  /**
   * Guest memory handed back to the host (docs/microvm.md): a virtio-balloon device that
   * takes the guest's free page reports (QEMU punches each reported range out of the RAM
   * file), and the guest's cold page cache reclaimed every `cacheReclaimSeconds` (0: never;
   * guest/reclaim.c) so that it becomes free pages to report.
   */
  returnMemory?: { cacheReclaimSeconds: number };
}

/**
 * The smallest free block the guest reports, 2^5 pages (128 KiB), set by the guest's init
 * (guest/reclaim.c). The kernel's own choice, order 9 (2 MiB), never reports its 16 MiB DMA
 * zone (a zone is reported only with 32 blocks of the order free beyond its watermark), where
 * the 13.5 MiB compressed kernel was unpacked from: measured in docs/microvm.md.
 */
export const FREE_PAGE_REPORT_ORDER = 5;

/**
 * `-M microvm` with virtio-mmio devices only: no PCI, no firmware tables beyond microvm's
 * ACPI, a NIC only with a network (mode none: no network device at all). `-no-reboot`: a
 * guest panic or reboot ends QEMU.
 */
export function qemuArgs(s: QemuSpec): string[] {
  const cmdline = ['console=ttyS0', 'quiet', 'panic=-1', 'reboot=t', 'mitigations=off', 'random.trust_cpu=on', '8250.nr_uarts=1', 'no_timer_check', `rollbox.layers=${s.layerImages.length}`, `rollbox.blobs=${s.layerImages.map((l) => (l.blobPath ? '1' : '0')).join('')}`];
  if (s.accelerator === 'tcg' && s.tscKhz) cmdline.push(`tsc_early_khz=${s.tscKhz}`);
  if (s.nic) cmdline.push(`rollbox.net=${s.nic.address},${s.nic.gateway}`);
  if (s.pids) cmdline.push(`rollbox.pids=${s.pids}`);
  if (s.returnMemory?.cacheReclaimSeconds) cmdline.push(`rollbox.reclaim=${s.returnMemory.cacheReclaimSeconds}`);
  if (s.returnMemory) cmdline.push(`rollbox.reportorder=${FREE_PAGE_REPORT_ORDER}`);
  const args = [
    // TCG's translation buffer is charged to the sandbox's cgroup: bounded (cgroup.ts), and
    // smaller where the VM hands memory back (what a buffer touched once stays resident).
    '-accel', s.accelerator === 'tcg' ? `tcg,tb-size=${s.returnMemory ? TCG_TB_RETURN_MEMORY_MIB : TCG_TB_MIB}` : s.accelerator,
    // pit/pic/rtc: under TCG the guest kernel calibrates its timers against them.
    '-M', 'microvm,pit=on,pic=on,rtc=on,memory-backend=ram',
    ...(s.accelerator === 'kvm' ? ['-cpu', 'host'] : []),
    '-smp', String(s.vcpus),
    '-m', String(s.memoryMiB),
    '-object', `memory-backend-file,id=ram,size=${s.memoryMiB}M,mem-path=${s.ramFile},share=on`,
    '-nodefaults', '-no-user-config', '-nographic', '-no-reboot',
    '-serial', 'stdio',
    '-kernel', s.kernel, '-initrd', s.initramfs, '-append', cmdline.join(' '),
  ];
  // rerror=report: a read that fails on the host (a lazy layer's chunk the gate could not
  // fetch: EIO) is the guest's I/O error, never a paused VM (stop) or a silent retry.
  s.layerImages.forEach((layer, i) => {
    args.push('-drive', `id=l${i},file=${layer.imagePath},format=raw,if=none,readonly=on,rerror=report`, '-device', `virtio-blk-device,drive=l${i},serial=rbl${i}`);
    if (layer.blobPath) args.push('-drive', `id=l${i}b,file=${layer.blobPath},format=raw,if=none,readonly=on,rerror=report`, '-device', `virtio-blk-device,drive=l${i}b,serial=rbl${i}b`);
  });
  args.push('-drive', `id=disk,file=${s.diskImage},format=raw,if=none,discard=unmap`, '-device', 'virtio-blk-device,drive=disk,serial=rbdisk');
  args.push('-device', 'virtio-serial-device', '-chardev', `socket,id=agent,path=${s.agentSocket},server=on,wait=off`, '-device', `virtserialport,chardev=agent,name=rollbox.0,id=${GUEST_PORT_ID}`);
  // vhost off: no /dev/vhost-net needed, and no kernel thread outside QEMU's cgroup.
  if (s.nic) args.push('-netdev', `tap,id=net0,ifname=${s.nic.tap},script=no,downscript=no,vhost=off`, '-device', 'virtio-net-device,netdev=net0');
  // Free page reporting only (no inflation by the host): QEMU discards what the guest reports free.
  if (s.returnMemory) args.push('-device', 'virtio-balloon-device,free-page-reporting=on');
  args.push('-qmp', `unix:${s.qmpSocket},server=on,wait=off`);
  if (s.eventsSocket) args.push('-qmp', `unix:${s.eventsSocket},server=on,wait=off`);
  if (s.incoming) args.push('-S', '-incoming', 'defer');
  return args;
}

/**
 * Starts QEMU in its own session (it outlives a worker process that stops without
 * stopping it), console output to `consoleLog`; with a NIC, inside the sandbox's network
 * namespace (nsenter execs QEMU: the pid is QEMU's). `prefix` runs first and execs the
 * rest (the cgroup placement, cgroup.ts), so the pid stays QEMU's.
 */
export function startQemu(spec: QemuSpec, consoleLog: string, prefix: readonly string[] = []): ChildProcess {
  const log = fs.openSync(consoleLog, 'a');
  try {
    const command = [...prefix, ...(spec.nic ? ['nsenter', `--net=${netnsPathOf(spec.nic.netns)}`, '--'] : []), spec.qemuBinary, ...qemuArgs(spec)];
    const child = spawn(command[0]!, command.slice(1), { stdio: ['ignore', log, log], detached: true });
    child.unref();
    return child;
  } finally {
    fs.closeSync(log);
  }
}

/** Whether a process of this pid is alive and is QEMU (a reused pid is not ours). */
export function isQemuPid(pid: number, qemuBinary: string): boolean {
  try {
    const exe = fs.readlinkSync(`/proc/${pid}/exe`);
    return exe.endsWith(qemuBinary.split('/').pop()!);
  } catch {
    return false;
  }
}
