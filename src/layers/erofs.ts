import { open } from 'node:fs/promises';
import { RollboxError } from '../api/index.ts';
import { runToolOk } from '../proc/index.ts';

export const SUPER_OFFSET = 1024;
export const EROFS_MAGIC = 0xe0f5e1e2;
export const FEATURE_COMPAT_SB_CHKSUM = 0x1;

/**
 * Build an uncompressed EROFS image of `srcDir` at `outPath`, reproducibly.
 *
 * mkfs.erofs 1.5 can only be deterministic with `-T`, which also overwrites every file's
 * mtime. We want per-file mtimes kept (build tools and .pyc caches compare them), so we
 * build with `--preserve-mtime`, a fixed UUID and no xattrs, then reset the one field
 * that still varies between runs (the superblock build time) and fix the superblock
 * checksum. With --preserve-mtime every inode whose mtime differs from the build time is
 * written as an extended inode that carries its own mtime, so the patch changes no file's
 * visible timestamp (a file whose mtime equals the build instant to the microsecond is
 * the only exception and is not a real-world case).
 */
export async function mkfsErofs(
  srcDir: string,
  outPath: string,
  opts: {
    mkfsBinary?: string;
    /**
     * Keep extended attributes. Needed for an overlay upper dir (pack_diff): its opaque
     * directories are marked `trusted.overlay.opaque`; its whiteouts are 0:0 char devices,
     * which EROFS keeps as they are, so the image works as a lower layer.
     */
    keepXattrs?: boolean;
    /** Paths relative to srcDir to leave out, each with everything under it. */
    excludePaths?: readonly string[];
    /**
     * A split image: every file's contents go to this data blob (the EROFS extra device,
     * `--blobdev`) in chunks of `chunkSizeBytes`, and `outPath` holds only the metadata.
     */
    blob?: { path: string; chunkSizeBytes: number };
  } = {},
): Promise<void> {
  await runToolOk(opts.mkfsBinary ?? 'mkfs.erofs', [
    '--quiet',
    opts.keepXattrs ? '-x2' : '-x-1',
    ...(opts.excludePaths ?? []).map((p) => `--exclude-path=${p}`),
    ...(opts.blob ? [`--blobdev=${opts.blob.path}`, `--chunksize=${opts.blob.chunkSizeBytes}`] : []),
    '-U',
    '00000000-0000-0000-0000-000000000000',
    '--preserve-mtime',
    outPath,
    srcDir,
  ]);
  await normalizeSuperblock(outPath);
}

async function normalizeSuperblock(imagePath: string): Promise<void> {
  const fh = await open(imagePath, 'r+');
  try {
    const head = Buffer.alloc(SUPER_OFFSET + 128);
    await fh.read(head, 0, head.length, 0);
    const sb = head.subarray(SUPER_OFFSET);
    if (sb.readUInt32LE(0) !== EROFS_MAGIC) throw new RollboxError('internal', `${imagePath}: not an EROFS image`);
    const blkszbits = sb.readUInt8(0x0c);
    const blockBytes = 1 << blkszbits;
    const region = Buffer.alloc(blockBytes - SUPER_OFFSET);
    await fh.read(region, 0, region.length, SUPER_OFFSET);
    const hasChecksum = (region.readUInt32LE(0x08) & FEATURE_COMPAT_SB_CHKSUM) !== 0;
    if (hasChecksum) {
      // Verify our reading of the format before rewriting anything.
      const stored = region.readUInt32LE(0x04);
      region.writeUInt32LE(0, 0x04);
      if (crc32c(0xffffffff, region) !== stored) {
        throw new RollboxError('internal', `${imagePath}: unexpected EROFS superblock checksum; refusing to patch`);
      }
    }
    region.writeBigUInt64LE(0n, 0x18); // build_time
    region.writeUInt32LE(0, 0x20); // build_time_nsec
    if (hasChecksum) {
      region.writeUInt32LE(0, 0x04);
      region.writeUInt32LE(crc32c(0xffffffff, region), 0x04);
    }
    await fh.write(region, 0, region.length, SUPER_OFFSET);
    await fh.sync();
  } finally {
    await fh.close();
  }
}

let table: Uint32Array | undefined;

/** Raw CRC32C (Castagnoli, reflected) as the kernel's crc32c(): seeded, no final xor. */
export function crc32c(seed: number, data: Uint8Array): number {
  if (!table) {
    table = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0x82f63b78 ^ (c >>> 1) : c >>> 1;
      table[n] = c >>> 0;
    }
  }
  let crc = seed >>> 0;
  for (let i = 0; i < data.length; i++) crc = (table[(crc ^ data[i]!) & 0xff]! ^ (crc >>> 8)) >>> 0;
  return crc;
}
