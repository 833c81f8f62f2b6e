import { readFileSync, writeFileSync } from 'node:fs';
import { isMountPoint } from '../../layers/index.ts';
import type { RuntimeContext } from './context.ts';
import { DiskOpError, MS_NODEV, MS_NOSUID } from './diskhelper.ts';
import { EXT4_OPTIONS } from './disk-templates.ts';

/**
 * A running sandbox's disk is not mounted on the host: once the sandbox's overlay holds it
 * (the overlay keeps a private reference to its upper dir's mount), the host's own mount of
 * it goes (`releaseDisk`), because every container start copies the host's mount table into
 * its new mount namespace and drops it again, which at 3,000 sandboxes, one disk mount each,
 * cost ~50 ms of kernel time per start. The filesystem, its loop device and its image stay
 * while the overlay lives, and the host mounts the disk again through that loop device when
 * it needs the upper dir (snapshots; destroys, which shut the filesystem down before the
 * container dies). The device is kept in the bundle, for a worker that adopts the sandbox
 * after a restart.
 */
export function recordDiskDevice(ctx: RuntimeContext, id: string, device: string): void {
  writeFileSync(ctx.layout.diskDeviceFileOf(id), device);
}

function diskDeviceOf(ctx: RuntimeContext, id: string): string | undefined {
  try {
    return readFileSync(ctx.layout.diskDeviceFileOf(id), 'utf8').trim() || undefined;
  } catch {
    return undefined;
  }
}

/** The host lets go of the sandbox's disk. Best effort: a disk that stays mounted only costs that copy. */
export async function releaseDisk(ctx: RuntimeContext, id: string): Promise<void> {
  const target = ctx.layout.diskOf(id);
  await ctx.diskHelper.umount(target).catch((err: unknown) => ctx.log?.warn({ target, err: String(err) }, 'the host kept its mount of a sandbox disk'));
}

/**
 * Mounts the sandbox's disk on the host again. False when it is mounted already or its
 * filesystem is gone with its container (the loop device no longer bound to its image).
 */
export async function mountDiskOnHost(ctx: RuntimeContext, id: string): Promise<boolean> {
  const device = diskDeviceOf(ctx, id);
  const target = ctx.layout.diskOf(id);
  if (!device || isMountPoint(target)) return false;
  try {
    await ctx.diskHelper.mountLoop(device, ctx.scratch.imageOf(id), target, 'ext4', MS_NOSUID | MS_NODEV, EXT4_OPTIONS);
    return true;
  } catch (err) {
    if (err instanceof DiskOpError && (err.errno === 'ENXIO' || err.errno === 'ENOENT')) return false;
    throw err;
  }
}

/** `fn` with the sandbox's disk mounted on the host (its upper dir readable there), then let go again. */
export async function withDiskOnHost<T>(ctx: RuntimeContext, id: string, fn: () => Promise<T>): Promise<T> {
  const mounted = await mountDiskOnHost(ctx, id);
  try {
    return await fn();
  } finally {
    if (mounted) await releaseDisk(ctx, id);
  }
}
