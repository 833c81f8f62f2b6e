import type { Readable } from 'node:stream';
import { sha256File } from '../digest.ts';
import { OPAQUE_XATTR } from '../image-entries.ts';
import { layerEntryOf, notAnEarlierFile, type EntryMeta, type LayerTarKind } from '../layer-entry.ts';
import { chunkTableBytes } from '../split.ts';
import { readTarEntries, type ExtractLimits } from '../tar-entries.ts';
import { BlobWriter } from './blob.ts';
import { writeErofsMetaImage } from './image.ts';
import { LayerTree, NONE, type NodeMetaInit } from './tree.ts';

export interface TarErofsOptions {
  /** An OCI or Docker image layer: whiteouts, opaque markers, FIFOs and xattrs as the extractor keeps them. */
  imageLayer?: boolean;
  /** An overlay upper dir as it is on disk (a microVM's snapshot stream; see LayerTarKind `upper`). */
  upperDir?: boolean;
  /** Entries at or under these paths (relative, `/`-separated) are dropped, whatever the tar says. */
  excludePaths?: readonly string[];
  /** Sees the decompressed tar (the image's diff_id is its sha256). */
  onTarChunk?: (chunk: Buffer) => void;
}

export interface SplitLayerFiles {
  metaPath: string;
  blobPath: string;
  chunkSizeBytes: number;
}

const metaOf = (m: EntryMeta): NodeMetaInit => ({ mode: m.mode, uid: m.uid, gid: m.gid, mtimeMs: m.mtime.getTime() });

/**
 * A tar (plain, gzip or zstd) straight into a split EROFS layer: file contents go to the
 * data blob as they stream by, the tree is kept in memory (compactly: tree.ts) and written
 * last as the metadata image. Nothing is extracted on the host and every byte is written
 * once, in its final place. The files the layer shows are those `extractTarSafely` + mkfs.erofs
 * would give (the same checks, the same replacement rules; compared in
 * test/tar-erofs.test.ts). Answers the chunk table's bytes (see LayerStore.putSplit).
 * The caller removes `files` when this fails.
 */
export async function writeErofsLayerFromTar(input: Readable, files: SplitLayerFiles, limits: ExtractLimits, options: TarErofsOptions = {}): Promise<Buffer> {
  const tree = new LayerTree(`${files.metaPath}.targets`);
  const blob = new BlobWriter(files.blobPath, files.chunkSizeBytes);
  const xattrs: [string[], string, Buffer][] = [];
  const opaque: string[][] = [];
  const kind: LayerTarKind = options.upperDir ? 'upper' : options.imageLayer ? 'image' : 'layer';
  const excluded = (options.excludePaths ?? []).map((p) => p.split('/').filter(Boolean)).filter((c) => c.length > 0);
  const isExcluded = (comps: readonly string[]): boolean => excluded.some((x) => x.length <= comps.length && x.every((c, i) => comps[i] === c));
  try {
    await readTarEntries(input, limits, options.onTarChunk, async (entry) => {
      const e = layerEntryOf(entry.header, kind);
      if (isExcluded(e.kind === 'opaque' ? e.dirComps : e.comps)) return entry.skip();
      if (e.kind === 'whiteout') {
        tree.ensureDir(e.comps.slice(0, -1));
        // It hides only what lies below this layer: an entry of the same name earlier in this layer stays.
        if (tree.lookup(e.comps) === NONE) tree.place(e.comps, tree.addNode('whiteout', { mode: 0, uid: 0, gid: 0, mtimeMs: 0 }));
        entry.skip();
        return;
      }
      if (e.kind === 'opaque') {
        tree.ensureDir(e.dirComps);
        opaque.push(e.dirComps);
        entry.skip();
        return;
      }
      for (const [name, value] of e.xattrs) xattrs.push([e.comps, name, value]);
      if (e.kind === 'none') return entry.skip();
      switch (e.kind) {
        case 'directory':
          tree.putDir(e.comps, metaOf(e.meta));
          break;
        case 'file': {
          tree.ensureDir(e.comps.slice(0, -1));
          const blobOffset = blob.startFile();
          let sizeBytes = 0;
          for await (const chunk of entry.contents()) {
            blob.write(chunk);
            sizeBytes += chunk.length;
          }
          tree.place(e.comps, tree.addNode('file', metaOf(e.meta), sizeBytes, blobOffset));
          return;
        }
        case 'symlink': {
          const target = tree.addTarget(e.target);
          tree.place(e.comps, tree.addNode('symlink', { ...metaOf(e.meta), mode: 0o777 }, target.offset, target.length));
          break;
        }
        case 'link': {
          tree.ensureDir(e.targetComps.slice(0, -1));
          const target = tree.lookup(e.targetComps);
          if (target === NONE || tree.kindOf(target) !== 'file') notAnEarlierFile(e);
          tree.place(e.comps, target);
          break;
        }
        case 'fifo':
          tree.place(e.comps, tree.addNode('fifo', metaOf(e.meta)));
          break;
      }
      entry.skip();
    });
    // As the extractor: xattrs, then opaque marks, on whatever the paths hold at the end.
    for (const [comps, name, value] of xattrs) tree.setXattr(comps, name, value);
    for (const comps of opaque) {
      const node = tree.lookup(comps);
      if (node !== NONE && tree.kindOf(node) === 'dir') tree.setXattr(comps, OPAQUE_XATTR, Buffer.from('y'));
    }
    blob.finish();
    writeErofsMetaImage(tree, files.metaPath, { chunkSizeBytes: files.chunkSizeBytes });
  } catch (err) {
    blob.abandon();
    throw err;
  } finally {
    tree.dispose();
  }
  const meta = await sha256File(files.metaPath);
  return chunkTableBytes({ sha256: meta.hex, sizeBytes: meta.sizeBytes }, blob.chunks);
}
