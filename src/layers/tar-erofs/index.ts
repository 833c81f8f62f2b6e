import { readSync } from 'node:fs';
import type { Duplex, Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { sha256File } from '../digest.ts';
import { OPAQUE_XATTR } from '../image-entries.ts';
import { layerEntryOf, notAnEarlierFile, type EntryMeta, type LayerTarKind } from '../layer-entry.ts';
import { chunkTableBytes } from '../split.ts';
import { decompressed } from '../decompress.ts';
import { toLayerError, type ExtractLimits } from '../tar-entries.ts';
import { TarPushReader } from '../tar-push.ts';
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
  return writeErofsLayer((reader) => readTar(input, reader), files, limits, options);
}

/**
 * The same from a file descriptor that gives the (decompressed) tar, read synchronously to
 * its end in large pieces into one buffer: for a layer thread reading a decompressor's output
 * through a FIFO (extract-workers.ts), where nothing else runs meanwhile.
 */
export async function writeErofsLayerFromFd(fd: number, files: SplitLayerFiles, limits: ExtractLimits, options: TarErofsOptions = {}): Promise<Buffer> {
  return writeErofsLayer(async (reader) => readFdInto(fd, reader), files, limits, options);
}

/** Pieces pushed to the reader from a descriptor: a pipe gives at most 64 KiB a read, so several reads fill one. */
const FD_PIECE_BYTES = 1 << 20;

function readFdInto(fd: number, reader: TarPushReader): void {
  const buffer = Buffer.allocUnsafe(FD_PIECE_BYTES);
  for (;;) {
    let filled = 0;
    let got: number;
    do {
      got = readSync(fd, buffer, filled, FD_PIECE_BYTES - filled, null);
      filled += got;
    } while (got > 0 && filled < FD_PIECE_BYTES / 2);
    if (filled > 0) reader.push(buffer.subarray(0, filled));
    if (got === 0) break;
  }
  reader.end();
}

async function writeErofsLayer(feed: (reader: TarPushReader) => Promise<void>, files: SplitLayerFiles, limits: ExtractLimits, options: TarErofsOptions): Promise<Buffer> {
  const tree = new LayerTree(`${files.metaPath}.targets`);
  const blob = new BlobWriter(files.blobPath, files.chunkSizeBytes);
  const xattrs: [string[], string, Buffer][] = [];
  const opaque: string[][] = [];
  const kind: LayerTarKind = options.upperDir ? 'upper' : options.imageLayer ? 'image' : 'layer';
  const excluded = (options.excludePaths ?? []).map((p) => p.split('/').filter(Boolean)).filter((c) => c.length > 0);
  const isExcluded = (comps: readonly string[]): boolean => excluded.some((x) => x.length <= comps.length && x.every((c, i) => comps[i] === c));
  const writeToBlob = (piece: Buffer): void => blob.write(piece);
  try {
    const reader = new TarPushReader(limits, options.onTarChunk, (header) => {
      const e = layerEntryOf(header, kind);
      if (isExcluded(e.kind === 'opaque' ? e.dirComps : e.comps)) return undefined;
      if (e.kind === 'whiteout') {
        tree.ensureDir(e.comps.slice(0, -1));
        // It hides only what lies below this layer: an entry of the same name earlier in this layer stays.
        if (tree.lookup(e.comps) === NONE) tree.place(e.comps, tree.addNode('whiteout', { mode: 0, uid: 0, gid: 0, mtimeMs: 0 }));
        return undefined;
      }
      if (e.kind === 'opaque') {
        tree.ensureDir(e.dirComps);
        opaque.push(e.dirComps);
        return undefined;
      }
      for (const [name, value] of e.xattrs) xattrs.push([e.comps, name, value]);
      switch (e.kind) {
        case 'none':
          return undefined;
        case 'directory':
          tree.putDir(e.comps, metaOf(e.meta));
          return undefined;
        case 'file': {
          tree.ensureDir(e.comps.slice(0, -1));
          // Its contents follow (the reader refuses a tar that ends before them): placed at its full size now.
          tree.place(e.comps, tree.addNode('file', metaOf(e.meta), header.size ?? 0, blob.startFile()));
          return writeToBlob;
        }
        case 'symlink': {
          const target = tree.addTarget(e.target);
          tree.place(e.comps, tree.addNode('symlink', { ...metaOf(e.meta), mode: 0o777 }, target.offset, target.length));
          return undefined;
        }
        case 'link': {
          tree.ensureDir(e.targetComps.slice(0, -1));
          const target = tree.lookup(e.targetComps);
          if (target === NONE || tree.kindOf(target) !== 'file') notAnEarlierFile(e);
          tree.place(e.comps, target);
          return undefined;
        }
        case 'fifo':
          tree.place(e.comps, tree.addNode('fifo', metaOf(e.meta)));
          return undefined;
      }
    });
    await feed(reader);
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

/** The tar (decompressed if it is gzip or zstd) through `reader`, piece by piece. */
async function readTar(input: Readable, reader: TarPushReader): Promise<void> {
  let stages: [Readable] | [Readable, Duplex];
  try {
    stages = await decompressed(input);
  } catch (err) {
    throw toLayerError(err);
  }
  const consume = async (tar: AsyncIterable<Buffer>): Promise<void> => {
    for await (const chunk of tar) reader.push(chunk);
    reader.end();
  };
  try {
    await (stages.length === 2 ? pipeline(stages[0], stages[1], consume) : pipeline(stages[0], consume));
  } catch (err) {
    input.destroy();
    throw toLayerError(err);
  }
}
