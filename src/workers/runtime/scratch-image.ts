import { closeSync, openSync, readSync } from 'node:fs';
import { RollboxError } from '../../api/index.ts';
import { listLoopDevices } from '../../layers/index.ts';
import { runTool } from '../../proc/index.ts';
import { mkfsExt4 } from './disk-templates.ts';

const MIB = 1024 * 1024;

/** The scratch filesystem's type (see scratch.ts: XFS clones disks for forks; ext4 cannot). */
export type ScratchFsType = 'xfs' | 'ext4';

export interface ScratchImage {
  path: string;
  fsType: ScratchFsType;
  mkfsBinary?: string;
  mkfsXfsBinary?: string;
}

/** Format the scratch image (its size set already). */
export async function formatScratch(image: ScratchImage, sizeBytes: number): Promise<void> {
  if (image.fsType === 'ext4') {
    // Few, large files: one inode per 1 MiB is plenty and keeps the inode table small.
    const inodes = String(Math.max(4096, Math.floor(sizeBytes / MIB)));
    return mkfsExt4(image.path, ['-N', inodes], image.mkfsBinary);
  }
  const r = await runTool(image.mkfsXfsBinary ?? 'mkfs.xfs', ['-q', '-f', '-m', 'reflink=1', image.path]);
  if (r.code !== 0) throw new RollboxError('internal', `mkfs.xfs of the scratch filesystem failed: ${r.stderr.trim()}`);
}

/**
 * The existing image can be mounted again: a filesystem of the configured type, and that
 * no loop device still holds (mounting one filesystem through two devices corrupts it).
 * An ext4 must have been unmounted cleanly (a journal-less ext4 clears VALID_FS in its
 * superblock while mounted, so a crash leaves it unset); XFS replays its log at mount.
 */
export async function scratchReusable(image: ScratchImage): Promise<boolean> {
  let fd: number | undefined;
  try {
    fd = openSync(image.path, 'r');
    const sb = Buffer.alloc(4);
    if (image.fsType === 'xfs') {
      if (readSync(fd, sb, 0, 4, 0) !== 4 || sb.toString('latin1') !== 'XFSB') return false;
    } else {
      if (readSync(fd, sb, 0, 4, 1024 + 0x38) !== 4) return false;
      const magic = sb.readUInt16LE(0);
      const state = sb.readUInt16LE(2);
      if (magic !== 0xef53 || (state & 0x1) === 0 || (state & 0x2) !== 0) return false;
    }
  } catch {
    return false;
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
  return !(await listLoopDevices()).some((l) => l.backingFile === image.path);
}
