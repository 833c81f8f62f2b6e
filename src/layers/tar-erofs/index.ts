import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import type { Readable } from 'node:stream';
import { RollboxError } from '../../api/index.ts';
import { entryComponents, symlinkStaysInside } from '../extract.ts';
import { OPAQUE_XATTR, classifyImageEntry, imageXattrsOf } from '../image-entries.ts';
import { chunkTableBytes } from '../split.ts';
import { readTarEntries, type ExtractLimits } from '../tar-entries.ts';
import { BlobWriter } from './blob.ts';
import { erofsMetaImage } from './image.ts';
import { LayerTree, type NodeMetaInit } from './tree.ts';

export { erofsMetaImage } from './image.ts';

const MAX_PATH_CHARS = 4096;

export interface TarErofsOptions {
  /** An OCI or Docker image layer: whiteouts, opaque markers, FIFOs and xattrs as the extractor keeps them. */
  imageLayer?: boolean;
  /** Sees the decompressed tar (the image's diff_id is its sha256). */
  onTarChunk?: (chunk: Buffer) => void;
}

export interface SplitLayerFiles {
  metaPath: string;
  blobPath: string;
  chunkSizeBytes: number;
}

function refuse(message: string): never {
  throw new RollboxError('invalid_layer', message);
}

/**
 * A tar (plain, gzip or zstd) straight into a split EROFS layer: file contents go to the
 * data blob as they stream by, the tree is kept in memory and written last as the
 * metadata image. Nothing is extracted on the host and every byte is written once, in
 * its final place. The files the layer shows are those `extractTarSafely` + mkfs.erofs
 * would give (the same checks, the same replacement rules; compared in
 * test/tar-erofs.test.ts). Answers the chunk table's bytes (see LayerStore.putSplit).
 * The caller removes `files` when this fails.
 */
export async function writeErofsLayerFromTar(input: Readable, files: SplitLayerFiles, limits: ExtractLimits, options: TarErofsOptions = {}): Promise<Buffer> {
  const tree = new LayerTree();
  const blob = new BlobWriter(files.blobPath, files.chunkSizeBytes);
  const xattrs: [string[], string, Buffer][] = [];
  const opaque: string[][] = [];
  try {
    await readTarEntries(input, limits, options.onTarChunk, async (entry) => {
      const h = entry.header;
      const comps = entryComponents(h.name, 'entry');
      if (options.imageLayer) {
        const special = classifyImageEntry(comps, h);
        if (special.kind === 'whiteout') {
          tree.ensureDir(special.comps.slice(0, -1));
          // It hides only what lies below this layer: an entry of the same name earlier in this layer stays.
          if (!tree.lookup(special.comps)) tree.place(special.comps, { kind: 'whiteout', mode: 0, uid: 0, gid: 0, mtimeMs: 0, xattrs: new Map() });
          entry.skip();
          return;
        }
        if (special.kind === 'opaque') {
          tree.ensureDir(special.dirComps);
          opaque.push(special.dirComps);
          entry.skip();
          return;
        }
        for (const [name, value] of imageXattrsOf(h.name, h.pax as Record<string, string> | undefined)) xattrs.push([comps, name, value]);
      } else if (comps[comps.length - 1]?.startsWith('.wh.')) {
        refuse(`overlay whiteout ${JSON.stringify(h.name)} belongs in an image (POST /v1/images), not a layer`);
      }
      const meta: NodeMetaInit = { mode: (h.mode ?? 0o644) & 0o7777, uid: h.uid ?? 0, gid: h.gid ?? 0, mtimeMs: h.mtime?.getTime() ?? 0 };
      const type = h.type ?? 'file';
      if (comps.length === 0) {
        if (type !== 'directory') refuse(`entry ${JSON.stringify(h.name)} names the layer root but is not a directory`);
        tree.putDir(comps, meta);
        entry.skip();
        return;
      }
      const rel = comps.join('/');
      switch (type) {
        case 'directory':
          tree.putDir(comps, meta);
          entry.skip();
          return;
        case 'file':
        case 'contiguous-file': {
          tree.ensureDir(comps.slice(0, -1));
          const blobOffset = blob.startFile();
          let sizeBytes = 0;
          for await (const chunk of entry.contents()) {
            blob.write(chunk);
            sizeBytes += chunk.length;
          }
          tree.place(comps, { kind: 'file', ...meta, xattrs: new Map(), sizeBytes, blobOffset });
          return;
        }
        case 'symlink': {
          const target = h.linkname ?? '';
          if (target === '' || target.includes('\0') || target.length > MAX_PATH_CHARS) refuse(`symlink ${JSON.stringify(rel)} has an invalid target`);
          if (!symlinkStaysInside(comps, target)) refuse(`symlink ${JSON.stringify(rel)} -> ${JSON.stringify(target)} points outside the layer`);
          tree.place(comps, { kind: 'symlink', ...meta, mode: 0o777, xattrs: new Map(), target: Buffer.from(target, 'utf8') });
          entry.skip();
          return;
        }
        case 'link': {
          const targetComps = entryComponents(h.linkname ?? '', 'hardlink target');
          if (targetComps.length === 0) refuse(`hardlink ${JSON.stringify(rel)} has an empty target`);
          entry.skip();
          if (targetComps.join('/') === rel) return;
          tree.ensureDir(targetComps.slice(0, -1));
          const target = tree.lookup(targetComps);
          if (target?.kind !== 'file') refuse(`hardlink ${JSON.stringify(rel)} -> ${JSON.stringify(targetComps.join('/'))} does not name an earlier regular file`);
          tree.place(comps, target);
          return;
        }
        case 'character-device':
        case 'block-device':
          refuse(`device node ${JSON.stringify(rel)} is not allowed in a layer`);
          break;
        case 'fifo':
          if (!options.imageLayer) refuse(`fifo ${JSON.stringify(rel)} is not supported in a layer`);
          tree.place(comps, { kind: 'fifo', ...meta, xattrs: new Map() });
          entry.skip();
          return;
        default:
          refuse(`entry ${JSON.stringify(rel)} has unsupported type ${String(type)}`);
      }
    });
    // As the extractor: xattrs, then opaque marks, on whatever the paths hold at the end.
    for (const [comps, name, value] of xattrs) tree.setXattr(comps, name, value);
    for (const comps of opaque) if (tree.lookup(comps)?.kind === 'dir') tree.setXattr(comps, OPAQUE_XATTR, Buffer.from('y'));
  } catch (err) {
    blob.abandon();
    throw err;
  }
  blob.finish();
  const meta = erofsMetaImage(tree.root, { chunkSizeBytes: files.chunkSizeBytes });
  writeFileSync(files.metaPath, meta, { flag: 'wx', mode: 0o600 });
  return chunkTableBytes({ sha256: createHash('sha256').update(meta).digest('hex'), sizeBytes: meta.length }, blob.chunks);
}
