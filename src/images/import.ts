import path from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import tar from 'tar-stream';
import { MAX_STACK_LAYERS, RollboxError, type Image, type ImportedImage, type ImportImageQuery } from '../api/index.ts';
import { tap } from '../layers/index.ts';
import { readImageLayer, type ImageLayerBlob, type ImageLayerDeps, type Owned } from './layer.ts';
import { ImageLayerSet, type ImageLayerSetDeps } from './layer-set.ts';
import { chooseImage } from './manifest.ts';

export type ImageImportDeps = ImageLayerDeps & ImageLayerSetDeps;

/** JSON files (manifests, configs, indexes) are small; anything past this is a layer or not ours. */
const METADATA_MAX_BYTES = 4 * 1024 * 1024;
const METADATA_TOTAL_MAX_BYTES = 64 * 1024 * 1024;

function invalid(message: string): never {
  throw new RollboxError('invalid_image', message);
}

function notATar(err: unknown): never {
  invalid(`the archive is not a complete tar: ${err instanceof Error ? err.message : String(err)}`);
}

/** An archive member's path, relative and clean; anything climbing out is refused (it is never written anywhere, but names blobs). */
function memberPath(name: string): string {
  const clean = path.posix.normalize(name.replace(/^(\.\/)+/, '')).replace(/\/$/, '');
  if (clean.startsWith('/') || clean === '..' || clean.startsWith('../') || name.includes('\0')) invalid(`archive entry ${JSON.stringify(name).slice(0, 200)} is not a relative path`);
  return clean;
}

async function readAll(stream: Readable): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of stream as AsyncIterable<Buffer>) chunks.push(c);
  return Buffer.concat(chunks);
}

const looksLikeJson = (buf: Buffer): boolean => /^\s*[[{]/.test(buf.subarray(0, 64).toString('latin1'));

/**
 * Imports a `docker save` archive or an OCI image layout (one tar, streamed): each layer blob
 * becomes a content-addressed EROFS layer while the archive is read (the archive itself is
 * never stored), then the manifest picks the image, every digest is checked, and the image
 * record is written. Nothing of a failed import stays: the layers it added are removed.
 */
export async function importImage(input: Readable, query: ImportImageQuery, deps: ImageImportDeps & Owned): Promise<ImportedImage> {
  const startedMs = performance.now();
  if (await deps.layers.resolve(query.name, { tenant: deps.owner, all: false }).then(() => true, () => false)) {
    throw new RollboxError('conflict', `${query.name} is a layer's name; an image needs a name of its own (image.base takes either)`);
  }
  const metadata = new Map<string, Buffer>();
  const set = new ImageLayerSet(deps);
  const builds = new Map<string, Promise<ImageLayerBlob>>();
  const aliases = new Map<string, string>();
  let metadataBytes = 0;
  let archiveBytes = 0;
  // One EROFS build at a time runs beside the reading of the next blob: disk holds at most two extracted layers.
  let building: Promise<unknown> = Promise.resolve();

  const extract = tar.extract();
  let archiveError: unknown;
  const piping = pipeline(input, tap((c) => (archiveBytes += c.length)), extract).catch((err: unknown) => {
    archiveError ??= err;
  });

  try {
    try {
      const entries = extract[Symbol.asyncIterator]();
      for (;;) {
        // The tar reader's own failures (a cut-off stream, a header that is not tar) are the archive's fault.
        const next = await entries.next().catch(notATar);
        if (next.done) break;
        const entry = next.value;
        const h = entry.header;
        const name = memberPath(h.name);
        // Older docker save writes a layer shared by two of its images once, and a symlink for the other.
        if (h.type === 'symlink' && name.endsWith('layer.tar')) {
          aliases.set(name, memberPath(path.posix.join(path.posix.dirname(name), h.linkname ?? '')));
          entry.resume();
          continue;
        }
        if (h.type !== 'file' && h.type !== 'contiguous-file') {
          entry.resume();
          continue;
        }
        const claimed = /^blobs\/sha256\/([0-9a-f]{64})$/.exec(name);
        const isLayerTar = path.posix.basename(name) === 'layer.tar';
        let blob = entry as unknown as Readable;
        if (!isLayerTar && (h.size ?? 0) <= METADATA_MAX_BYTES) {
          const buf = await readAll(blob);
          if (!claimed || looksLikeJson(buf)) {
            metadataBytes += buf.length;
            if (metadataBytes > METADATA_TOTAL_MAX_BYTES) invalid(`the archive's small files exceed ${METADATA_TOTAL_MAX_BYTES} bytes`);
            metadata.set(name, buf);
            continue;
          }
          blob = Readable.from([buf]); // a small layer
        } else if (!claimed && !isLayerTar) {
          entry.resume(); // neither a blob nor a layer: not part of any image
          continue;
        }
        const { build } = await readImageLayer(blob, claimed ? `sha256:${claimed[1]}` : undefined, name, deps);
        await building.catch(() => undefined);
        const built = set.add(build());
        building = built;
        builds.set(name, built);
      }
    } catch (err) {
      extract.destroy();
      input.destroy();
      await piping;
      // An entry's bytes that stopped coming: the archive's fault, whatever read them.
      if (!(err instanceof RollboxError) && archiveError) notATar(archiveError);
      throw err;
    }
    await piping;
    if (archiveError) notATar(archiveError);

    const chosen = chooseImage(metadata, query);
    if (chosen.layerPaths.length > MAX_STACK_LAYERS) invalid(`the image has ${chosen.layerPaths.length} layers; a sandbox stacks at most ${MAX_STACK_LAYERS}`);
    const layers = await Promise.all(
      chosen.layerPaths.map(async (p, i) => {
        const built = builds.get(aliases.get(p) ?? p);
        if (!built) invalid(`the manifest names layer ${p}, which is not in the archive`);
        const layer = await built;
        if (layer.diffId !== chosen.diffIds[i]) invalid(`layer ${p}: its uncompressed tar hashes to ${layer.diffId}, the image config says ${chosen.diffIds[i]}`);
        return layer;
      }),
    );
    const image: Image = {
      name: query.name,
      digest: chosen.digest,
      platform: chosen.platform,
      layers: layers.map((l) => ({ digest: l.digest, diffId: l.diffId, sizeBytes: l.sizeBytes })),
      config: chosen.config,
      sizeBytes: layers.reduce((s, l) => s + l.sizeBytes, 0),
      createdAt: new Date(deps.now()).toISOString(),
    };
    await set.commit(image);
    const distinct = [...new Map(layers.map((l) => [l.digest, l])).values()];
    return {
      ...image,
      state: 'ready',
      import: {
        layersBuilt: distinct.filter((l) => !l.reused).length,
        layersReused: distinct.filter((l) => l.reused).length,
        archiveBytes,
        durationMs: Math.round(performance.now() - startedMs),
      },
    };
  } catch (err) {
    await set.abort();
    throw err;
  } finally {
    await set.release();
  }
}
