import { createHash, randomBytes } from 'node:crypto';
import { copyFile, chmod, link, mkdir, readFile, readdir, rename, rm, stat, unlink, utimes, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { hexOfDigest, sha256File } from './digest.ts';
import { chunkTableOf } from './split.ts';

/**
 * Where a layer's files are on this host, as a mount needs them. A single-image layer (the
 * format before split layers, and what a worker packs for snapshots and hibernation) is one
 * EROFS image; a split layer is its metadata image (`imagePath`) plus its data blob, the
 * EROFS device the files' contents live in.
 */
export interface LayerFiles {
  digest: string;
  /** The single image, or the split layer's metadata image. */
  imagePath: string;
  /** A split layer's data blob. */
  blobPath?: string;
  /** The blob is this host's sparse chunk cache, filled on first read (see src/layers/lazy). */
  lazy?: boolean;
}

export interface StoredLayer {
  digest: string;
  /** Bytes stored: the image, or meta + blob (+ the chunk table). */
  sizeBytes: number;
  files: LayerFiles;
}

/** The files of a split layer in a store. */
export interface SplitPaths {
  tablePath: string;
  metaPath: string;
  blobPath: string;
}

/** The files of a VM saved whole (src/workers/microvm/hibernation.ts IMAGE_FILES), hibernated or for a fork. */
export const WHOLE_VM_IMAGE_FILES = ['ram', 'devices', 'disk.ext4', 'vm.json'] as const;

/**
 * Content-addressed store of EROFS layers under `<dir>/sha256/`:
 *   - split layers (what every build makes): `<hex>.chunks` (the chunk table, whose sha256
 *     is the digest), `<hex>.meta` (metadata image), `<hex>.blob` (data blob);
 *   - single-image layers (snapshots, hibernation, and layers of older data dirs, which keep
 *     working as they are): `<hex>.erofs`, whose sha256 is the digest.
 * A stored file is never modified (mode 0444) and only ever replaced by identical bytes,
 * so readers and mounts can use its path without locking. A split layer's table is moved in
 * last: a layer is stored once its table is there.
 *
 * Beside the layers, `<dir>/hibernated/<sandbox id>/` holds the images of microVMs
 * hibernated whole (src/workers/microvm/hibernation.ts): on the shared store, so any host
 * that shares it can wake them; removed by the wake, or by layer GC once their sandbox ended.
 * `<dir>/vmforks/<fork point id>/` holds the image of a fork that keeps processes (the same
 * files): every child, on any host that shares the store, is restored from it; removed by the
 * gateway once the fork's children have started, or by layer GC after FORK_IMAGE_MAX_AGE_MS.
 */
export class LayerStore {
  readonly dir: string;

  constructor(dir: string) {
    this.dir = path.resolve(dir);
  }

  /** The single image of `digest` (whether or not it exists). */
  imagePathOf(digest: string): string {
    return path.join(this.dir, 'sha256', `${hexOfDigest(digest)}.erofs`);
  }

  splitPathsOf(digest: string): SplitPaths {
    const base = path.join(this.dir, 'sha256', hexOfDigest(digest));
    return { tablePath: `${base}.chunks`, metaPath: `${base}.meta`, blobPath: `${base}.blob` };
  }

  /** Where the origin keeps the layer's blob chunks gzipped (gzipped-chunks.ts). */
  gzippedChunksDirOf(digest: string): string {
    return path.join(this.dir, 'sha256', `${hexOfDigest(digest)}.gz`);
  }

  /** The layer's files, or undefined when it is not stored here. */
  async locate(digest: string): Promise<LayerFiles | undefined> {
    const split = this.splitPathsOf(digest);
    if (await isFile(split.tablePath)) return { digest, imagePath: split.metaPath, blobPath: split.blobPath };
    const imagePath = this.imagePathOf(digest);
    return (await isFile(imagePath)) ? { digest, imagePath } : undefined;
  }

  async has(digest: string): Promise<boolean> {
    return (await this.locate(digest)) !== undefined;
  }

  /** A split layer's chunk table bytes (undefined: not a split layer stored here). */
  async chunkTable(digest: string): Promise<Buffer | undefined> {
    return readFile(this.splitPathsOf(digest).tablePath).catch(() => undefined);
  }

  /**
   * Store a single EROFS image under its sha256. The source file is consumed (moved or
   * deleted). Idempotent: storing the same bytes twice yields the same result; `added`
   * tells whether these bytes were new to the store.
   */
  async put(tmpImagePath: string): Promise<StoredLayer & { added: boolean }> {
    const { hex, sizeBytes } = await sha256File(tmpImagePath);
    const digest = `sha256:${hex}`;
    const imagePath = this.imagePathOf(digest);
    const files = { digest, imagePath };
    if (await isFile(imagePath)) {
      await unlink(tmpImagePath).catch(() => undefined);
      await touch(imagePath);
      return { digest, sizeBytes, files, added: false };
    }
    await this.moveIn(tmpImagePath, imagePath, hex);
    return { digest, sizeBytes, files, added: true };
  }

  /**
   * Store a split layer: built by mkfs.erofs (`--blobdev`, see mkfsErofs), whose chunk table
   * is computed here, or copied from another store with its table (`table`: bytes the caller
   * checked the meta and blob against). The table's sha256 is the digest. The meta and blob
   * files are consumed.
   */
  async putSplit(tmp: { metaPath: string; blobPath: string; chunkSizeBytes: number; table?: Buffer }): Promise<StoredLayer & { added: boolean }> {
    const table = tmp.table ?? (await chunkTableOf(tmp.metaPath, tmp.blobPath, tmp.chunkSizeBytes));
    const hex = createHash('sha256').update(table).digest('hex');
    const digest = `sha256:${hex}`;
    const paths = this.splitPathsOf(digest);
    const sizeBytes = (await stat(tmp.metaPath)).size + (await stat(tmp.blobPath)).size;
    const files = { digest, imagePath: paths.metaPath, blobPath: paths.blobPath };
    if (await isFile(paths.tablePath)) {
      await Promise.all([unlink(tmp.metaPath), unlink(tmp.blobPath)].map((p) => p.catch(() => undefined)));
      await touch(paths.tablePath);
      return { digest, sizeBytes, files, added: false };
    }
    await this.moveIn(tmp.metaPath, paths.metaPath, hex);
    await this.moveIn(tmp.blobPath, paths.blobPath, hex);
    const tableTmp = `${tmp.metaPath}.chunks`;
    await writeFile(tableTmp, table);
    await this.moveIn(tableTmp, paths.tablePath, hex);
    return { digest, sizeBytes, files, added: true };
  }

  /** Move a finished file into place, atomically (a reader sees no file or the whole file); read-only. */
  private async moveIn(from: string, to: string, hex: string): Promise<void> {
    await mkdir(path.dirname(to), { recursive: true });
    await chmod(from, 0o444);
    try {
      await rename(from, to);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EXDEV') throw err;
      // Different filesystem: copy beside the target first so the final step stays a rename.
      const staging = path.join(this.dir, 'tmp', `${hex}.${randomBytes(6).toString('hex')}`);
      await mkdir(path.dirname(staging), { recursive: true });
      try {
        await copyFile(from, staging);
        await chmod(staging, 0o444);
        await rename(staging, to);
      } finally {
        await rm(staging, { force: true });
      }
      await unlink(from).catch(() => undefined);
    }
  }

  /** Where the image of a sandbox hibernated whole lives (whether or not it exists). */
  hibernatedImageDirOf(sandboxId: string): string {
    return path.join(this.dir, 'hibernated', path.basename(sandboxId));
  }

  /** Sandbox ids with a hibernated image (or the part of one being written) here. */
  async listHibernated(): Promise<string[]> {
    const names = await readdir(path.join(this.dir, 'hibernated')).catch(() => [] as string[]);
    return [...new Set(names.map((n) => n.replace(/\.part-\d+$/, '')))];
  }

  async removeHibernated(sandboxId: string): Promise<void> {
    const dir = this.hibernatedImageDirOf(sandboxId);
    const parts = (await readdir(path.dirname(dir)).catch(() => [] as string[])).filter((n) => n.startsWith(`${path.basename(dir)}.part-`));
    for (const p of [dir, ...parts.map((n) => path.join(path.dirname(dir), n))]) await rm(p, { recursive: true, force: true });
  }

  /** Where the image of a fork that keeps processes lives (whether or not it exists). */
  forkImageDirOf(forkPointId: string): string {
    return path.join(this.dir, 'vmforks', path.basename(forkPointId));
  }

  /**
   * A fork's image from the image of a sandbox hibernated whole, without waking it: its files
   * hard-linked (nobody writes an image's files in place: a wake copies them out and removes
   * its names, a new hibernation renames a new directory into place), so the parent may wake
   * at any time after. False when the image is gone (the parent woke meanwhile).
   */
  async linkForkImage(sandboxId: string, forkPointId: string): Promise<boolean> {
    const from = this.hibernatedImageDirOf(sandboxId);
    const to = this.forkImageDirOf(forkPointId);
    const partial = `${to}.part-${process.pid}`;
    await rm(partial, { recursive: true, force: true });
    await mkdir(partial, { recursive: true, mode: 0o700 });
    try {
      // Each file, or none: a wake removing the image meanwhile leaves some of them gone (ENOENT).
      for (const name of WHOLE_VM_IMAGE_FILES) await link(path.join(from, name), path.join(partial, name));
      await rename(partial, to);
      return true;
    } catch (err) {
      await rm(partial, { recursive: true, force: true });
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
      throw err;
    }
  }

  /** Fork images here (and parts of ones being written), each with when it was last changed. */
  async listForkImages(): Promise<{ name: string; changedAtMs: number }[]> {
    const dir = path.join(this.dir, 'vmforks');
    const names = await readdir(dir).catch(() => [] as string[]);
    const out: { name: string; changedAtMs: number }[] = [];
    for (const name of names) {
      const changedAtMs = await stat(path.join(dir, name)).then((s) => s.mtimeMs, () => undefined);
      if (changedAtMs !== undefined) out.push({ name, changedAtMs });
    }
    return out;
  }

  /** A fork image (or a part of one, by its listed name). Safe to call twice. */
  async removeForkImage(name: string): Promise<void> {
    await rm(path.join(this.dir, 'vmforks', path.basename(name)), { recursive: true, force: true });
  }

  /** Digests of every stored layer. */
  async list(): Promise<string[]> {
    const names = await readdir(path.join(this.dir, 'sha256')).catch(() => [] as string[]);
    const out = new Set<string>();
    for (const n of names) if (/^[0-9a-f]{64}\.(erofs|chunks)$/.test(n)) out.add(`sha256:${n.slice(0, 64)}`);
    return [...out];
  }

  /** When the layer was last stored (undefined: not stored). */
  async storedAtMs(digest: string): Promise<number | undefined> {
    const split = await stat(this.splitPathsOf(digest).tablePath).then((s) => s.mtimeMs, () => undefined);
    return split ?? stat(this.imagePathOf(digest)).then((s) => s.mtimeMs, () => undefined);
  }

  /**
   * Delete a layer's files (the table first, so a half-removed layer is not stored). Callers
   * make sure no sandbox still uses it (a mount keeps its open files alive anyway).
   */
  async remove(digest: string): Promise<void> {
    const split = this.splitPathsOf(digest);
    for (const p of [split.tablePath, split.metaPath, split.blobPath, this.imagePathOf(digest)]) await rm(p, { force: true });
    await rm(this.gzippedChunksDirOf(digest), { recursive: true, force: true });
  }
}

async function isFile(p: string): Promise<boolean> {
  return stat(p).then((s) => s.isFile(), () => false);
}

/** Stored again: a fresh mtime tells garbage collection the layer is in use again. */
async function touch(p: string): Promise<void> {
  const now = new Date();
  await utimes(p, now, now).catch(() => undefined);
}
