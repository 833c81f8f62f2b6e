import { randomBytes } from 'node:crypto';
import { copyFile, chmod, mkdir, readdir, rename, rm, stat, unlink, utimes } from 'node:fs/promises';
import path from 'node:path';
import { hexOfDigest, sha256File } from './digest.ts';

export interface StoredLayer {
  digest: string;
  sizeBytes: number;
  imagePath: string;
}

/**
 * Content-addressed store of EROFS images: `<dir>/sha256/<hex>.erofs`. A stored image is
 * never modified (mode 0444) and is only ever replaced by identical bytes, so readers and
 * loop mounts can use a path from `pathOf` without locking.
 */
export class LayerStore {
  readonly dir: string;

  constructor(dir: string) {
    this.dir = path.resolve(dir);
  }

  pathOf(digest: string): string {
    return path.join(this.dir, 'sha256', `${hexOfDigest(digest)}.erofs`);
  }

  async has(digest: string): Promise<boolean> {
    try {
      return (await stat(this.pathOf(digest))).isFile();
    } catch {
      return false;
    }
  }

  /**
   * Move a finished image into the store under its sha256. The source file is consumed
   * (moved or deleted). Idempotent: storing the same bytes twice yields the same result;
   * `added` tells whether these bytes were new to the store.
   */
  async put(tmpImagePath: string): Promise<StoredLayer & { added: boolean }> {
    const { hex, sizeBytes } = await sha256File(tmpImagePath);
    const digest = `sha256:${hex}`;
    const imagePath = this.pathOf(digest);
    await mkdir(path.dirname(imagePath), { recursive: true });
    if (await this.has(digest)) {
      await unlink(tmpImagePath).catch(() => undefined);
      // Stored again: a fresh mtime tells garbage collection the image is in use again.
      const now = new Date();
      await utimes(imagePath, now, now).catch(() => undefined);
      return { digest, sizeBytes, imagePath, added: false };
    }
    await chmod(tmpImagePath, 0o444);
    try {
      // rename is atomic: a reader sees either no file or the whole image.
      await rename(tmpImagePath, imagePath);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EXDEV') throw err;
      // Different filesystem: copy beside the target first so the final step stays a rename.
      const staging = path.join(this.dir, 'tmp', `${hex}.${randomBytes(6).toString('hex')}`);
      await mkdir(path.dirname(staging), { recursive: true });
      try {
        await copyFile(tmpImagePath, staging);
        await chmod(staging, 0o444);
        await rename(staging, imagePath);
      } finally {
        await rm(staging, { force: true });
      }
      await unlink(tmpImagePath).catch(() => undefined);
    }
    return { digest, sizeBytes, imagePath, added: true };
  }

  /** Digests of every stored image. */
  async list(): Promise<string[]> {
    const names = await readdir(path.join(this.dir, 'sha256')).catch(() => [] as string[]);
    return names.flatMap((n) => (/^[0-9a-f]{64}\.erofs$/.test(n) ? [`sha256:${n.slice(0, 64)}`] : []));
  }

  /** When the image was last stored (undefined: not stored). */
  async storedAtMs(digest: string): Promise<number | undefined> {
    return stat(this.pathOf(digest)).then((s) => s.mtimeMs, () => undefined);
  }

  /** Delete an image. Callers make sure no sandbox still uses it (a mounted loop device keeps its inode alive anyway). */
  async remove(digest: string): Promise<void> {
    await rm(this.pathOf(digest), { force: true });
  }
}
