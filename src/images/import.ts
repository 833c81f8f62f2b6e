import path from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import tar from 'tar-stream';
import { MAX_STACK_LAYERS, RollboxError, type Image, type ImportedImage, type ImportImageQuery } from '../api/index.ts';
import { tap, type LayerStore } from '../layers/index.ts';
import type { ImageRegistry, LayerRegistry } from '../registry/index.ts';
import { readImageLayer, type ImageLayerBlob, type ImageLayerDeps } from './layer.ts';
import { chooseImage } from './manifest.ts';

export interface ImageImportDeps extends ImageLayerDeps {
  store: Pick<LayerStore, 'has' | 'put' | 'pathOf' | 'remove'>;
  layers: Pick<LayerRegistry, 'register' | 'get' | 'pin' | 'unpin' | 'forget' | 'resolve'>;
  images: Pick<ImageRegistry, 'diffIdOfBlob' | 'layerOfDiffId' | 'remember' | 'put' | 'layerDigests'>;
  /** Layers the imports running in this process hold (one instance per gateway). */
  holds: ImportHolds;
}

/**
 * Which layers running imports hold: a failed import removes the layers it added only
 * when no other import holds them (two imports of images on one new base build it
 * once each; the one that stored it first may be the one that fails).
 */
export class ImportHolds {
  private readonly counts = new Map<string, number>();

  take(digest: string): void {
    this.counts.set(digest, (this.counts.get(digest) ?? 0) + 1);
  }

  release(digest: string): void {
    const n = (this.counts.get(digest) ?? 0) - 1;
    if (n > 0) this.counts.set(digest, n);
    else this.counts.delete(digest);
  }

  heldByOthers(digest: string): boolean {
    return (this.counts.get(digest) ?? 0) > 1;
  }
}

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
export async function importImage(input: Readable, query: ImportImageQuery, deps: ImageImportDeps): Promise<ImportedImage> {
  const startedMs = performance.now();
  if (await deps.layers.resolve(query.name).then(() => true, () => false)) {
    throw new RollboxError('conflict', `${query.name} is a layer's name; an image needs a name of its own (image.base takes either)`);
  }
  const metadata = new Map<string, Buffer>();
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
        const built = build().then((layer) => {
          deps.holds.take(layer.digest);
          return layer;
        });
        built.catch(() => undefined); // awaited below; not an unhandled rejection meanwhile
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
    // Layers of other platforms or images in the archive: built, but nothing uses them.
    const used = new Set(layers.map((l) => l.digest));
    const unused = (await Promise.all(builds.values())).filter((l) => !used.has(l.digest));
    await removeLayers(unused, deps);

    const image: Image = {
      name: query.name,
      digest: chosen.digest,
      platform: chosen.platform,
      layers: layers.map((l) => ({ digest: l.digest, diffId: l.diffId, sizeBytes: l.sizeBytes })),
      config: chosen.config,
      sizeBytes: layers.reduce((s, l) => s + l.sizeBytes, 0),
      createdAt: new Date(deps.now()).toISOString(),
    };
    await deps.images.put(image);
    // The image record references them now.
    await Promise.all([...used].map((d) => deps.layers.unpin(d)));
    const distinct = [...new Map(layers.map((l) => [l.digest, l])).values()];
    return {
      ...image,
      import: {
        layersBuilt: distinct.filter((l) => !l.reused).length,
        layersReused: distinct.filter((l) => l.reused).length,
        archiveBytes,
        durationMs: Math.round(performance.now() - startedMs),
      },
    };
  } catch (err) {
    await removeLayers(await settledLayers(builds), deps);
    throw err;
  } finally {
    for (const layer of await settledLayers(builds)) deps.holds.release(layer.digest);
  }
}

async function settledLayers(builds: Map<string, Promise<ImageLayerBlob>>): Promise<ImageLayerBlob[]> {
  return (await Promise.allSettled(builds.values())).flatMap((s) => (s.status === 'fulfilled' ? [s.value] : []));
}

/**
 * Unpins layers of a failed (or partly unused) import and removes the ones it added, unless
 * an image or another running import uses them (the pin is shared: another import's pin
 * goes too, but its hold keeps the layer, and its image record protects it from then on).
 */
async function removeLayers(layers: readonly ImageLayerBlob[], deps: ImageImportDeps): Promise<void> {
  if (layers.length === 0) return;
  const inImages = new Set(await deps.images.layerDigests());
  for (const layer of layers) {
    if (deps.holds.heldByOthers(layer.digest) || inImages.has(layer.digest)) continue;
    await deps.layers.unpin(layer.digest);
    if (!layer.added) continue;
    await deps.layers.forget(layer.digest);
    await deps.store.remove(layer.digest);
  }
}
