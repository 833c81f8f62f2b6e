import { mkdirSync, rmSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { RollboxError } from '../../api/index.ts';
import { isMountPoint } from '../../layers/index.ts';
import { runTool } from '../../proc/index.ts';
import { setFreezerState } from './cgroups.ts';
import type { RuntimeContext } from './context.ts';
import { withDiskOnHost } from './disk-on-host.ts';
import { EXT4_OPTIONS } from './disk-templates.ts';
import { DiskOpError, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_RDONLY } from './diskhelper.ts';
import { freezerStateFile } from './policy.ts';
import { packDir } from './snapshot.ts';

/**
 * A fork point left behind by a gateway that never came back for it (it died mid-fork) is
 * removed after this long; a fork's children clone it within seconds of its making.
 */
const FORK_POINT_TTL_MS = 10 * 60_000;

/** Errors of a clone where the filesystem cannot clone (ext4, a copy on another filesystem). */
const CANNOT_CLONE = new Set(['EOPNOTSUPP', 'ENOTSUP', 'EXDEV', 'EINVAL', 'ENOTTY']);

/**
 * Fork points (see scratch.ts): a sandbox's disk frozen into a clone for one moment, which
 * a fork's children on this host start their own disks from, and which is packed into a
 * layer only when a child elsewhere needs one.
 */
export class ForkPoints {
  private readonly expiry = new Map<string, NodeJS.Timeout>();

  constructor(private readonly ctx: RuntimeContext) {}

  /**
   * The sandbox frozen (cgroup freezer: nothing in it writes) only while its disk is synced
   * and its image cloned. undefined where the scratch filesystem cannot clone.
   */
  async make(sandboxId: string, forkPointId: string): Promise<{ frozenMs: number } | undefined> {
    const { ctx } = this;
    const stateFile = await freezerStateFile(ctx, sandboxId);
    const disk = ctx.layout.diskOf(sandboxId);
    const made = await withDiskOnHost(ctx, sandboxId, async () => {
      if (!isMountPoint(disk)) throw new RollboxError('invalid_state', `sandbox ${sandboxId} has no disk on this host`);
      // Written back first, while it runs, so the freeze has little left to write.
      await runTool('sync', ['--file-system', disk]);
      const wasFrozen = (await readFile(stateFile, 'utf8')).trim() === 'FROZEN';
      const frozenAt = performance.now();
      if (!wasFrozen) await setFreezerState(stateFile, 'FROZEN');
      try {
        const cloned = await this.clone(sandboxId, forkPointId);
        return cloned ? { frozenMs: wasFrozen ? 0 : performance.now() - frozenAt } : undefined;
      } finally {
        if (!wasFrozen) await setFreezerState(stateFile, 'THAWED');
      }
    });
    if (made) this.expiry.set(forkPointId, setTimeout(() => this.remove(forkPointId), FORK_POINT_TTL_MS).unref());
    return made;
  }

  /** False where the scratch filesystem cannot clone (an ext4 one). */
  private async clone(sandboxId: string, forkPointId: string): Promise<boolean> {
    const { ctx } = this;
    try {
      await ctx.diskHelper.cloneSynced(ctx.layout.diskOf(sandboxId), ctx.scratch.imageOf(sandboxId), ctx.scratch.forkPointOf(forkPointId));
      return true;
    } catch (err) {
      if (err instanceof DiskOpError && CANNOT_CLONE.has(err.errno)) return false;
      throw err;
    }
  }

  /** The fork point's writable layer (its overlay upper dir) as an EROFS image at `outPath`, without `excludePaths`. */
  async pack(forkPointId: string, outPath: string, excludePaths: readonly string[] = []): Promise<void> {
    const { ctx } = this;
    const mountPoint = path.join(ctx.layout.forkPointMountsDir, forkPointId);
    mkdirSync(mountPoint, { recursive: true, mode: 0o700 });
    try {
      await ctx.diskHelper.mountImage(ctx.scratch.forkPointOf(forkPointId), mountPoint, 'ext4', MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, EXT4_OPTIONS, true);
      try {
        await packDir(path.join(mountPoint, 'upper'), outPath, excludePaths);
      } finally {
        await ctx.diskHelper.umount(mountPoint);
      }
    } finally {
      rmSync(mountPoint, { recursive: true, force: true });
    }
  }

  remove(forkPointId: string): void {
    clearTimeout(this.expiry.get(forkPointId));
    this.expiry.delete(forkPointId);
    rmSync(this.ctx.scratch.forkPointOf(forkPointId), { force: true }); // a stray one goes at the next start (reconcile)
  }
}
