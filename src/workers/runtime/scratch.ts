// Longer than most: the scratch filesystem and the per-sandbox disks on it (attach, clone,
// detach, idle unmount) share one serialized chain, which a split would have to share again.
import { closeSync, ftruncateSync, mkdirSync, openSync, readdirSync, rmSync, statSync, statfsSync } from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { RollboxError } from '../../api/index.ts';
import { isMountPoint, loopsLeft } from '../../layers/index.ts';
import { DiskOpError, MNT_DETACH, MS_NODEV, MS_NOEXEC, MS_NOSUID, type DiskHelper } from './diskhelper.ts';
import { DiskTemplates, EXT4_OPTIONS } from './disk-templates.ts';
import { formatScratch, scratchReusable, type ScratchFsType, type ScratchImage } from './scratch-image.ts';
import { runTool } from '../../proc/index.ts';
import type { RuntimeLogger } from './logger.ts';

const MIB = 1024 * 1024;
const GIB = 1024 * MIB;


export interface ScratchDisksDeps {
  /** Absolute; the scratch image is `<dataDir>/scratch.img`, mounted at `<dataDir>/scratch`. */
  dataDir: string;
  helper: DiskHelper;
  /**
   * Size of the scratch filesystem, fixed when it is created (sparse on the host). Default:
   * half the free space of the host filesystem under dataDir, at most 64 GiB.
   */
  sizeGiB?: number;
  /**
   * Reserve each sandbox's whole disk in the scratch filesystem at create (default false:
   * like CPU, disk is overcommitted, since most agents write a small part of what they
   * may; with 1 GiB per sandbox a reservation would cap a host at a few dozen). The
   * reservation costs no host disk (the scratch image stays sparse) but caps the sum of
   * live diskMiB at the scratch size: a create that does not fit fails cleanly with
   * no_capacity. With false, disks are sparse and overcommit the scratch filesystem; if it
   * ever fills, sandboxes see I/O errors (EIO) rather than ENOSPC. The host disk never fills
   * either way.
   */
  preallocate?: boolean;
  /** Distinct disk sizes whose formatted template is kept (default 32). */
  maxTemplates?: number;
  /** How long it stays mounted once its last disk is gone (default 0; worker hosts: ROLLBOX_NODE_IDLE_UNMOUNT_MS). */
  idleUnmountDelayMs?: number;
  /** The scratch filesystem's type (default xfs; see the class). Sandbox disks are ext4 either way. */
  fsType?: ScratchFsType;
  mkfsBinary?: string;
  mkfsXfsBinary?: string;
  losetupBinary?: string;
  logger?: RuntimeLogger;
}

/**
 * The writable layer of every sandbox lives on its own small ext4 filesystem: the kernel
 * here has neither XFS quotas (CONFIG_XFS_QUOTA off) nor the quota formats ext4 project
 * quotas need (CONFIG_QFMT_V2 off), so a size-capped filesystem per sandbox is the cap.
 * Its size is diskMiB, so writes past it fail with ENOSPC, and its inode count is
 * `inodesForDisk(diskMiB)`, so an inode flood fails with ENOSPC too.
 *
 * Those filesystems are image files inside ONE scratch filesystem per host (an XFS image,
 * sparse on the host, loop-mounted at `<dataDir>/scratch`), so everything sandboxes write is
 * bounded by the scratch size and the host disk cannot fill. Like a layer mount, the scratch
 * filesystem is mounted by the first sandbox that needs it and unmounted a while after the
 * last disk in it goes (a host without sandboxes keeps no mounts); the image stays, so mounting it
 * again costs ~3 ms, not a mkfs. `teardown` (reconcile with nothing kept) deletes it. A
 * worker restart finds it mounted, with the disks of the sandboxes it adopts. A disk is made
 * by copying a pre-formatted template of its size (formatted once per size, ~20 ms; the copy
 * writes ~150 KB for 1 GiB), then loop-attached and mounted at `<bundle>/disk` by the helper
 * process; upper/ and work/ of the sandbox's overlay are directories in it.
 *
 * The scratch filesystem is XFS because XFS clones files (reflinks): a fork freezes a
 * sandbox's disk for a moment and clones its image into a fork point (`fork-<id>.img`
 * beside the disks), and each child's disk starts as a clone of that, sharing every block
 * until one side writes it, so N children of a sandbox with 64 MiB written cost no copy.
 * `fsType: 'ext4'` keeps the older scratch filesystem (no clones: forks pack a layer).
 *
 * Loop devices are attached with autoclear, so they detach themselves when their last mount
 * goes; nothing here depends on this process's memory to be cleaned up after a crash.
 */
export class ScratchDisks {
  private idleUnmount: NodeJS.Timeout | undefined;
  readonly imagePath: string;
  readonly mountPoint: string;
  readonly disksDir: string;
  readonly templatesDir: string;
  /** Mounting and unmounting the scratch filesystem happen one at a time, in order. */
  private chain: Promise<void> = Promise.resolve();
  /** attach() calls in progress: the scratch filesystem is not unmounted under them. */
  private attaching = 0;
  private readonly templates: DiskTemplates;
  private readonly image: ScratchImage;

  constructor(private readonly deps: ScratchDisksDeps) {
    this.imagePath = path.join(deps.dataDir, 'scratch.img');
    this.mountPoint = path.join(deps.dataDir, 'scratch');
    this.disksDir = path.join(this.mountPoint, 'disks');
    this.templatesDir = path.join(this.mountPoint, 'templates');
    this.templates = new DiskTemplates(this.templatesDir, deps.maxTemplates ?? 32, deps.mkfsBinary);
    this.image = { path: this.imagePath, fsType: deps.fsType ?? 'xfs', mkfsBinary: deps.mkfsBinary, mkfsXfsBinary: deps.mkfsXfsBinary };
  }

  imageOf(sandboxId: string): string {
    return path.join(this.disksDir, `${sandboxId}.img`);
  }

  /** A fork point: a frozen clone of a sandbox's disk that children's disks are cloned from. */
  forkPointOf(forkPointId: string): string {
    return path.join(this.disksDir, `fork-${forkPointId}.img`);
  }


  private serialized<T>(fn: () => Promise<T>): Promise<T> {
    const p = this.chain.then(fn);
    this.chain = p.then(() => undefined, () => undefined);
    return p;
  }

  /** Whether the scratch filesystem is mounted (two stats; sync, as on the create path). */
  isMounted(): boolean {
    try {
      return statSync(this.mountPoint).dev !== statSync(this.deps.dataDir).dev;
    } catch {
      return false;
    }
  }

  /** Mount the scratch filesystem unless it is mounted already (e.g. before a worker restart). */
  ensureMounted(): Promise<void> {
    return this.serialized(() => this.mountScratch());
  }

  private async mountScratch(): Promise<void> {
    mkdirSync(this.mountPoint, { recursive: true, mode: 0o700 });
    if (this.isMounted()) return;
    const { fsType } = this.image;
    const mountIt = (): Promise<string> => this.deps.helper.mountImage(this.imagePath, this.mountPoint, fsType, MS_NOSUID | MS_NODEV | MS_NOEXEC, fsType === 'ext4' ? EXT4_OPTIONS : '', true);
    let mounted = false;
    if (await scratchReusable(this.image)) {
      try {
        await mountIt();
        mounted = true;
      } catch (err) {
        this.deps.logger?.warn({ err: String(err) }, 'scratch image not mountable; making a new one');
      }
    }
    if (!mounted) {
      this.templates.clear();
      // Unlinking is safe even if a loop device still holds the old image: it keeps its inode.
      rmSync(this.imagePath, { force: true });
      const sizeBytes = this.scratchSizeBytes();
      const fd = openSync(this.imagePath, 'wx', 0o600);
      try {
        ftruncateSync(fd, sizeBytes);
      } finally {
        closeSync(fd);
      }
      try {
        await formatScratch(this.image, sizeBytes);
        await mountIt();
      } catch (err) {
        rmSync(this.imagePath, { force: true });
        throw err;
      }
      this.deps.logger?.info({ sizeMiB: Math.round(sizeBytes / MIB), mountPoint: this.mountPoint }, 'scratch filesystem created');
    }
    // While it was not mounted no sandbox had a disk in it: whatever is in disks/ is a leftover.
    rmSync(this.disksDir, { recursive: true, force: true });
    mkdirSync(this.disksDir, { mode: 0o700 });
    mkdirSync(this.templatesDir, { recursive: true, mode: 0o700 });
  }

  private scratchSizeBytes(): number {
    if (this.deps.sizeGiB !== undefined) {
      if (!(this.deps.sizeGiB > 0)) throw new RollboxError('invalid_request', 'scratchSizeGiB must be > 0');
      return Math.floor(this.deps.sizeGiB * GIB);
    }
    const fs = statfsSync(this.deps.dataDir);
    const halfFree = Math.floor((fs.bavail * fs.bsize) / 2);
    return Math.max(GIB, Math.floor(Math.min(64 * GIB, halfFree) / MIB) * MIB);
  }

  /**
   * Give sandbox `sandboxId` an empty disk of `diskMiB` mounted at `target` (an existing
   * empty dir), or with `forkPointId`, a clone of that fork point (of the same size).
   * Returns its loop device (see disk-on-host.ts).
   */
  async attach(sandboxId: string, diskMiB: number, target: string, forkPointId?: string): Promise<string> {
    if (!Number.isInteger(diskMiB) || diskMiB < 1) throw new RollboxError('invalid_request', `diskMiB must be a positive integer`);
    this.attaching++;
    let device: string;
    try {
      device = forkPointId === undefined ? await this.attachDisk(sandboxId, diskMiB, target) : await this.attachClone(sandboxId, forkPointId, target);
    } catch (err) {
      this.attaching--;
      await this.unmountIfIdle().catch((e: unknown) => this.deps.logger?.warn({ err: String(e) }, 'unmounting idle scratch filesystem failed'));
      throw err;
    }
    this.attaching--;
    return device;
  }

  private async attachDisk(sandboxId: string, diskMiB: number, target: string): Promise<string> {
    await this.ensureMounted();
    const image = this.imageOf(sandboxId);
    rmSync(image, { force: true }); // a leftover of a failed attempt; the caller holds the sandbox lock
    const preallocate = this.deps.preallocate ?? false;
    if (!preallocate) this.checkFree();
    for (let attempt = 0; ; attempt++) {
      const tpl = await this.templates.get(diskMiB);
      try {
        return await this.deps.helper.makeDisk(tpl, image, preallocate, target, 'ext4', MS_NOSUID | MS_NODEV, EXT4_OPTIONS);
      } catch (err) {
        rmSync(image, { force: true });
        if (err instanceof DiskOpError && err.errno === 'ENOSPC') {
          const free = this.freeBytes();
          throw new RollboxError('no_capacity', `no room for a ${diskMiB} MiB sandbox disk: ${Math.floor(free / MIB)} MiB of the host's scratch space left`);
        }
        // The template was evicted between lookup and copy: make it again, once.
        if (err instanceof DiskOpError && err.errno === 'ENOENT' && attempt === 0) {
          this.templates.forget(diskMiB);
          continue;
        }
        throw err;
      }
    }
  }

  private async attachClone(sandboxId: string, forkPointId: string, target: string): Promise<string> {
    await this.ensureMounted();
    const image = this.imageOf(sandboxId);
    rmSync(image, { force: true }); // a leftover of a failed attempt; the caller holds the sandbox lock
    try {
      return await this.deps.helper.cloneDisk(this.forkPointOf(forkPointId), image, target, 'ext4', MS_NOSUID | MS_NODEV, EXT4_OPTIONS);
    } catch (err) {
      if (err instanceof DiskOpError && err.errno === 'ENOENT') throw new RollboxError('invalid_state', `fork point ${forkPointId} is not on this host (its fork ended)`);
      throw err;
    }
  }

  /**
   * Size and free space of the scratch filesystem, MiB. Before it exists (no sandbox yet),
   * the size it will get and all of it free.
   */
  space(): { sizeMiB: number; freeMiB: number } {
    if (this.isMounted()) {
      try {
        const fs = statfsSync(this.mountPoint);
        return { sizeMiB: Math.floor((fs.blocks * fs.bsize) / MIB), freeMiB: Math.floor((fs.bavail * fs.bsize) / MIB) };
      } catch {
        // unmounted meanwhile (its last disk just went): as if never mounted
      }
    }
    const sizeMiB = Math.floor(this.scratchSizeBytes() / MIB);
    return { sizeMiB, freeMiB: sizeMiB };
  }

  private freeBytes(): number {
    try {
      const fs = statfsSync(this.mountPoint);
      return fs.bavail * fs.bsize;
    } catch {
      return 0;
    }
  }

  /** Overcommitted disks: refuse new sandboxes while the scratch filesystem is nearly full. */
  private checkFree(): void {
    const fs = statfsSync(this.mountPoint);
    if (fs.bavail < fs.blocks * 0.05) {
      throw new RollboxError('no_capacity', `the host's scratch space is nearly full (${Math.floor((fs.bavail * fs.bsize) / MIB)} MiB left)`);
    }
  }

  /**
   * Unmount a sandbox's disk (its loop device then detaches itself) and delete it; the last
   * disk also unmounts the scratch filesystem. Idempotent.
   */
  async detach(sandboxId: string, target: string): Promise<void> {
    // The disk is going away: writing its dirty pages back first (what umount would do)
    // could take seconds after a write-heavy command. Best effort: umount works regardless.
    if (isMountPoint(target)) await this.deps.helper.shutdown(target).catch((err: unknown) => this.deps.logger?.warn({ target, err: String(err) }, 'disk shutdown failed'));
    await this.unmount(target, 'sandbox disk', true);
    if (isMountPoint(target)) throw new RollboxError('internal', `${target} is still mounted`);
    if (!this.isMounted()) return;
    rmSync(this.imageOf(sandboxId), { force: true });
    // One-shot sandboxes come and go one at a time: unmounting and mounting it between them costs each ~100 ms.
    clearTimeout(this.idleUnmount);
    if (!this.deps.idleUnmountDelayMs) return this.unmountIfIdle();
    this.idleUnmount = setTimeout(() => void this.unmountIfIdle().catch((err: unknown) => this.deps.logger?.warn({ err: String(err) }, 'unmounting idle scratch filesystem failed')), this.deps.idleUnmountDelayMs).unref();
  }

  /** Unmount the scratch filesystem if no disk is in it and none is being made; keep the image. */
  private unmountIfIdle(): Promise<void> {
    return this.serialized(async () => {
      if (this.attaching > 0 || !this.isMounted()) return;
      if (readdirSync(this.disksDir).length > 0) return;
      await this.unmountScratch();
    });
  }

  /**
   * Sandbox disks' loop devices hold files of the scratch filesystem open; they detach
   * themselves once the last mount of their disk goes, which for a just-destroyed sandbox
   * can trail its unmount (the kernel drops the overlay in the dead container's mount
   * namespace on its own time): wait for them, then unmount. Never lazily: a scratch
   * filesystem detached but still in use could be mounted a second time from its image.
   */
  private async unmountScratch(): Promise<boolean> {
    await loopsLeft((l) => l.backingFile.startsWith(`${this.mountPoint}/`), 1280);
    await this.unmount(this.mountPoint, 'scratch filesystem', false);
    if (this.isMounted()) {
      this.deps.logger?.warn({ mountPoint: this.mountPoint }, 'scratch filesystem still busy; left mounted');
      return false;
    }
    return true;
  }

  /** Delete disk images of sandboxes not in `keep` and every fork point (leftovers of a crash). */
  removeStrayImages(keep: ReadonlySet<string>, names: readonly string[]): void {
    for (const name of names) {
      const id = name.endsWith('.img') ? name.slice(0, -4) : undefined;
      if (id !== undefined && !keep.has(id)) rmSync(path.join(this.disksDir, name), { force: true });
    }
  }

  /**
   * Unmount the scratch filesystem, detach its loop device and delete its image. Only when
   * no sandbox disk is mounted any more; their loop devices (which hold files on the scratch
   * filesystem open) detach asynchronously after the last overlay using them is gone, so
   * wait for them first.
   */
  teardown(): Promise<void> {
    clearTimeout(this.idleUnmount);
    return this.serialized(async () => {
      this.templates.clear();
      if (this.isMounted() && !(await this.unmountScratch())) return;
      // A loop device still bound to the image (e.g. attached by a worker that died before
      // mounting it, had autoclear not applied): detach it, or the next mount would refuse it.
      // A dead sandbox's mount namespace (holding the scratch filesystem) goes on the kernel's time: up to ~5 s.
      const ours = await loopsLeft((l) => l.backingFile.replace(/ \(deleted\)$/, '') === this.imagePath, 2560);
      for (const device of ours) await runTool(this.deps.losetupBinary ?? 'losetup', ['-d', device]);
      rmSync(this.imagePath, { force: true });
    });
  }

  /** umount with brief retries on EBUSY (a process still inside), then, if `lazy`, a lazy detach. */
  private async unmount(target: string, what: string, lazy: boolean): Promise<void> {
    for (let delayMs = 5; ; delayMs *= 2) {
      if (!isMountPoint(target)) return;
      try {
        await this.deps.helper.umount(target);
        return;
      } catch (err) {
        if (!(err instanceof DiskOpError) || err.errno !== 'EBUSY') throw err;
        if (delayMs > 640) break;
      }
      await sleep(delayMs);
    }
    if (!lazy) return;
    this.deps.logger?.warn({ target }, `${what} busy; detaching lazily`);
    await this.deps.helper.umount(target, MNT_DETACH);
  }
}
