/**
 * Image archives for the image benches (bench:import, bench:pull): layer tars written to
 * disk (never whole in memory), their gzip or zstd blobs, and OCI image layouts of them as
 * real tools write them (blobs first, then index.json and oci-layout).
 */
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import fs from 'node:fs/promises';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGzip } from 'node:zlib';
import { pack, type Header, type Pack } from 'tar-stream';
import { sha256File, tap } from '../../src/layers/index.ts';
import { runToolOk } from '../../src/proc/index.ts';
import { blobPath, imageJsonBlobs, MEDIA_TYPES, REF_NAME_ANNOTATION, type Descriptor, type ImageDef } from '../../test/support/oci.ts';

/** Every generated entry's mtime unless it says otherwise (a fixed, real-looking date: the images are the same on every run). */
export const MTIME = new Date(1_700_000_000_000);

export type AddEntry = (header: Partial<Header> & { name: string }, content?: Buffer | string) => Promise<void>;

/** A layer on disk: its tar, and its compressed blob as the image names it. */
export interface LayerBlobs {
  tar: string;
  tarBytes: number;
  diffId: string;
  /** The compressed blob's file (gzip or zstd, as `gzDescriptor.mediaType` says). */
  gz: string;
  gzDescriptor: Descriptor;
}

/** Streams a tar to `file` (never whole in memory); its sha256 and size. */
export async function writeTar(file: string, write: (add: AddEntry, archive: Pack) => Promise<void>): Promise<{ digest: string; bytes: number }> {
  const archive = pack();
  const hash = createHash('sha256');
  let bytes = 0;
  const hashing = tap((chunk) => {
    hash.update(chunk);
    bytes += chunk.length;
  });
  // An entry's callback comes once the pack took its bytes: awaiting it is the backpressure.
  const add: AddEntry = (header, content = '') => new Promise((resolve, reject) => archive.entry({ mtime: MTIME, ...header }, content, (err) => (err ? reject(err) : resolve())));
  const produce = async () => {
    await write(add, archive);
    archive.finalize();
  };
  await Promise.all([produce(), pipeline(Readable.from(archive as AsyncIterable<Buffer>), hashing, createWriteStream(file))]);
  return { digest: `sha256:${hash.digest('hex')}`, bytes };
}

/** One tar entry whose bytes come from a file on disk. */
async function addFileEntry(archive: Pack, name: string, file: string): Promise<void> {
  const { size } = await fs.stat(file);
  await new Promise<void>((resolve, reject) => {
    const sink = archive.entry({ name, size, mode: 0o644, mtime: new Date(0) }, (err) => (err ? reject(err) : resolve()));
    void (async () => {
      for await (const chunk of createReadStream(file)) if (!sink.write(chunk)) await new Promise<void>((r) => sink.once('drain', () => r()));
      sink.end(undefined);
    })().catch(reject);
  });
}

/** `file` gzip-compressed to `out`: the blob's digest and size. */
export async function gzipFile(file: string, out: string, level: number): Promise<{ digest: string; size: number }> {
  const hash = createHash('sha256');
  let size = 0;
  const hashing = tap((chunk) => {
    hash.update(chunk);
    size += chunk.length;
  });
  await pipeline(createReadStream(file), createGzip({ level }), hashing, createWriteStream(out));
  return { digest: `sha256:${hash.digest('hex')}`, size };
}

/** A tar of host files made by GNU tar (`args`: its -C and paths), gzip-compressed beside it. */
export async function hostTar(file: string, args: string[], gzipLevel: number): Promise<LayerBlobs> {
  // GNU tar keeps hard links, symlinks, modes and owners; --sort=name makes the bytes repeatable.
  await runToolOk('tar', ['--sort=name', '--numeric-owner', '-cf', file, ...args]);
  const { size } = await fs.stat(file);
  const diffId = `sha256:${(await sha256File(file)).hex}`;
  const { digest, size: gzSize } = await gzipFile(file, `${file}.gz`, gzipLevel);
  return { tar: file, tarBytes: size, diffId, gz: `${file}.gz`, gzDescriptor: { mediaType: MEDIA_TYPES.layerGzip, digest, size: gzSize } };
}

/** The same layers as an OCI layout whose layers are zstd (level 3), as `zstd` writes them. */
export async function zstdArchive(layers: Pick<LayerBlobs, 'tar' | 'diffId'>[], file: string, refName: string, imageConfig: ImageDef['config']): Promise<string> {
  const zstdLayers = [];
  for (const l of layers) {
    const zst = `${l.tar}.zst`;
    await runToolOk('zstd', ['-q', '-f', '-3', '-T0', l.tar, '-o', zst]);
    const bytes = await fs.readFile(zst);
    zstdLayers.push({ gz: zst, diffId: l.diffId, gzDescriptor: { mediaType: MEDIA_TYPES.layerZstd, digest: `sha256:${createHash('sha256').update(bytes).digest('hex')}`, size: bytes.length } });
  }
  await writeOciArchive(file, zstdLayers, refName, imageConfig);
  return file;
}

/** An OCI image layout of these layer blobs: its size in bytes. */
export async function writeOciArchive(file: string, layers: Pick<LayerBlobs, 'gz' | 'gzDescriptor' | 'diffId'>[], refName: string, imageConfig: ImageDef['config']): Promise<number> {
  const { config, manifest, configDescriptor } = imageJsonBlobs(
    { layers: [], config: imageConfig },
    layers.map((l) => l.gzDescriptor),
    layers.map((l) => l.diffId),
  );
  const manifestDescriptor: Descriptor = { mediaType: MEDIA_TYPES.manifest, digest: `sha256:${createHash('sha256').update(manifest).digest('hex')}`, size: manifest.length, annotations: { [REF_NAME_ANNOTATION]: refName } };
  const { bytes } = await writeTar(file, async (add, archive) => {
    await add({ name: 'blobs/', type: 'directory', mode: 0o755, mtime: new Date(0) });
    await add({ name: 'blobs/sha256/', type: 'directory', mode: 0o755, mtime: new Date(0) });
    const written = new Set<string>();
    for (const l of layers) {
      if (written.has(l.gzDescriptor.digest)) continue;
      written.add(l.gzDescriptor.digest);
      await addFileEntry(archive, blobPath(l.gzDescriptor.digest), l.gz);
    }
    await add({ name: blobPath(configDescriptor.digest), mtime: new Date(0) }, config);
    await add({ name: blobPath(manifestDescriptor.digest), mtime: new Date(0) }, manifest);
    await add({ name: 'index.json', mtime: new Date(0) }, JSON.stringify({ schemaVersion: 2, mediaType: MEDIA_TYPES.index, manifests: [manifestDescriptor] }));
    await add({ name: 'oci-layout', mtime: new Date(0) }, JSON.stringify({ imageLayoutVersion: '1.0.0' }));
  });
  return bytes;
}
