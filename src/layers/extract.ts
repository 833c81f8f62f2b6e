import { constants as fsc, chmodSync, closeSync, fchmodSync, fchownSync, futimesSync, lchownSync, linkSync, lstatSync, lutimesSync, mkdirSync, openSync, rmSync, symlinkSync, utimesSync, writeSync } from 'node:fs';
import path from 'node:path';
import type { Readable } from 'node:stream';
import { RollboxError } from '../api/index.ts';
import { ImageLayerEntries } from './image-entries.ts';
import { layerEntryOf, notAnEarlierFile, type EntryMeta } from './layer-entry.ts';
import { readTarEntries, type ExtractLimits } from './tar-entries.ts';

export type { ExtractLimits } from './tar-entries.ts';

export interface ExtractOptions {
  /**
   * A layer of an OCI or Docker image: whiteouts and opaque markers become overlayfs'
   * own, FIFOs and xattrs are kept (see ImageLayerEntries). Otherwise they are refused.
   */
  imageLayer?: boolean;
  /** Sees the tar's bytes after decompression (the image's diff_id is their sha256). */
  onTarChunk?: (chunk: Buffer) => void;
}

type DirMeta = EntryMeta;

const EPOCH = new Date(0);

function refuse(message: string): never {
  throw new RollboxError('invalid_layer', message);
}

/**
 * Extract a tar (optionally gzip-compressed) under `root` without ever writing outside it.
 *
 * Host safety does not rely on validating symlink targets: every parent directory is
 * checked with lstat to be a real directory we created (never a symlink), files are
 * created with O_EXCL|O_NOFOLLOW, and existing entries are replaced by unlinking, which
 * does not follow links. Only this process writes under `root` (a fresh 0700 temp dir),
 * so the lstat checks cannot be raced.
 *
 * The file system calls are synchronous: each takes microseconds on a local disk, while a
 * thread-pool round trip per call made extraction 5-10 times slower than tar(1) (tens of
 * thousands of calls per layer). The event loop still runs between chunks and entries.
 */
export async function extractTarSafely(input: Readable, root: string, limits: ExtractLimits, options: ExtractOptions = {}): Promise<void> {
  const dirs = new Map<string, DirMeta>(); // rel path ('' = root) -> final metadata
  const knownDirs = new Set<string>(['']); // rel paths verified to be real directories
  dirs.set('', { mode: 0o755, uid: 0, gid: 0, mtime: EPOCH });

  const abs = (comps: readonly string[]): string => path.join(root, ...comps);
  const image = options.imageLayer ? new ImageLayerEntries(abs) : undefined;

  /** Make sure every component of `comps` is a real directory, creating missing ones. */
  const ensureDirs = (comps: readonly string[]): void => {
    for (let i = 1; i <= comps.length; i++) {
      const rel = comps.slice(0, i).join('/');
      if (knownDirs.has(rel)) continue;
      const p = abs(comps.slice(0, i));
      const st = lstatSync(p, { throwIfNoEntry: false });
      if (!st) {
        mkdirSync(p, { mode: 0o755 });
        dirs.set(rel, { mode: 0o755, uid: 0, gid: 0, mtime: EPOCH });
      } else if (!st.isDirectory()) {
        refuse(`entry path ${JSON.stringify(rel)} passes through a ${st.isSymbolicLink() ? 'symlink' : 'non-directory'}`);
      }
      knownDirs.add(rel);
    }
  };

  /** Remove whatever is at `comps` (never following a symlink) unless it is a directory and `keepDir`. */
  const clearSlot = (comps: readonly string[], keepDir: boolean): 'dir' | 'empty' => {
    const p = abs(comps);
    const st = lstatSync(p, { throwIfNoEntry: false });
    if (!st) return 'empty';
    if (st.isDirectory() && keepDir) return 'dir';
    // rm does not follow symlinks; a later entry replacing an earlier one is plain tar semantics.
    rmSync(p, { recursive: true, force: true });
    const rel = comps.join('/');
    for (const k of [...knownDirs]) if (k === rel || k.startsWith(`${rel}/`)) knownDirs.delete(k);
    for (const k of [...dirs.keys()]) if (k === rel || k.startsWith(`${rel}/`)) dirs.delete(k);
    return 'empty';
  };

  await readTarEntries(input, limits, options.onTarChunk, async (entry) => {
    const e = layerEntryOf(entry.header, image ? 'image' : 'layer');
    if (e.kind === 'whiteout' || e.kind === 'opaque') {
      const dirComps = e.kind === 'whiteout' ? e.comps.slice(0, -1) : e.dirComps;
      ensureDirs(dirComps);
      if (e.kind === 'whiteout') await image!.whiteout(e.comps);
      else image!.opaque(dirComps);
      entry.skip();
      return;
    }
    image?.noteXattrs(e.comps, e.xattrs);
    const comps = e.comps;
    if (e.kind === 'directory' && comps.length === 0) {
      dirs.set('', e.meta);
      entry.skip();
      return;
    }
    const rel = comps.join('/');
    const parents = comps.slice(0, -1);
    switch (e.kind) {
      case 'directory': {
        ensureDirs(parents);
        if (clearSlot(comps, true) === 'empty') mkdirSync(abs(comps), { mode: 0o755 });
        knownDirs.add(rel);
        dirs.set(rel, e.meta);
        break;
      }
      case 'file': {
        const { mode, uid, gid, mtime } = e.meta;
        ensureDirs(parents);
        clearSlot(comps, false);
        const fd = openSync(abs(comps), fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW, 0o600);
        try {
          for await (const chunk of entry.contents()) {
            let off = 0;
            while (off < chunk.length) off += writeSync(fd, chunk, off, chunk.length - off);
          }
          // chown before chmod: chown clears set-id bits.
          fchownSync(fd, uid, gid);
          fchmodSync(fd, mode);
          futimesSync(fd, mtime, mtime);
        } finally {
          closeSync(fd);
        }
        return;
      }
      case 'symlink':
        ensureDirs(parents);
        clearSlot(comps, false);
        symlinkSync(e.target, abs(comps));
        lchownSync(abs(comps), e.meta.uid, e.meta.gid);
        lutimesSync(abs(comps), e.meta.mtime, e.meta.mtime);
        break;
      case 'link': {
        // The target's parents must be real directories inside the root and the target a
        // regular file already extracted: link() never follows a symlink, but we refuse
        // to link to anything else anyway.
        ensureDirs(e.targetComps.slice(0, -1));
        const st = lstatSync(abs(e.targetComps), { throwIfNoEntry: false });
        if (!st || !st.isFile()) notAnEarlierFile(e);
        ensureDirs(parents);
        clearSlot(comps, false);
        linkSync(abs(e.targetComps), abs(comps));
        break;
      }
      case 'fifo':
        ensureDirs(parents);
        clearSlot(comps, false);
        await image!.fifo(comps);
        lchownSync(abs(comps), e.meta.uid, e.meta.gid);
        chmodSync(abs(comps), e.meta.mode);
        // The entry's time, not the extraction's: the same tar must give the same EROFS image.
        utimesSync(abs(comps), e.meta.mtime, e.meta.mtime);
        break;
    }
    entry.skip();
  });

  // Directory metadata last, deepest first: adding children changes a directory's mtime.
  const ordered = [...dirs.entries()].sort((a, b) => b[0].split('/').length - a[0].split('/').length);
  for (const [rel, meta] of ordered) {
    const p = rel === '' ? root : path.join(root, rel);
    lchownSync(p, meta.uid, meta.gid);
    chmodSync(p, meta.mode);
    utimesSync(p, meta.mtime, meta.mtime);
  }
  await image?.finish();
}
