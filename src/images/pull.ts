import { pipeline } from 'node:stream/promises';
import { MAX_STACK_LAYERS, RollboxError, type Image, type ImportReport, type PullProgress } from '../api/index.ts';
import { MemoryScratchFull, tap, type MemoryReservation, type MemoryScratch } from '../layers/index.ts';
import { INDEX_MEDIA_TYPES, type ImageReference, type RegistryRepository } from '../oci-registry/index.ts';
import type { ImageImportDeps } from './import.ts';
import { heldLayer, readImageLayer, type ImageLayerBlob } from './layer.ts';
import { ImageLayerSet } from './layer-set.ts';
import { checkPlatform, imageConfigOf, manifestForPlatform, parseImageManifest, type Descriptor } from './manifest.ts';

export interface ImagePullDeps extends ImageImportDeps {
  /** A client for the reference's repository (the operator's credentials, mirrors and egress policy as they are now), whose every request ends with `signal`. */
  repository: (ref: ImageReference, signal: AbortSignal) => Promise<Pick<RegistryRepository, 'manifest' | 'blob' | 'blobStream'>>;
  /** Layer blobs fetched (and extracted) at once. */
  layerConcurrency: number;
  /** Where extracted trees may go instead of the disk (so a layer is written once, as its EROFS image). */
  memory?: MemoryScratch;
}

export interface PullTarget {
  /** The tenant the image and its layers become (CLUSTER_OWNER: published). */
  owner: string;
  name: string;
  ref: ImageReference;
  platform: string;
}

export interface PullListener {
  /** The manifest is read: what there is to do. */
  planned(digest: string, progress: PullProgress): void;
  /** Bytes or a layer done (called often; the listener throttles). */
  advanced(progress: PullProgress): void;
}

const CONFIG_MAX_BYTES = 4 * 1024 * 1024;
/**
 * A compressed layer's tree is reserved at this many times its blob (image layers compress
 * 2-4x; one that expands more is fetched again and built on disk), a plain one at its size.
 */
const COMPRESSED_EXPANSION = 4;
const TREE_SLACK_BYTES = 1 << 20;

function treeEstimateBytes(d: Descriptor & { size: number }): number {
  const compressed = /gzip|zstd/.test(d.mediaType ?? 'gzip');
  return Math.ceil(d.size * (compressed ? COMPRESSED_EXPANSION : 1)) + TREE_SLACK_BYTES;
}

/**
 * Pulls an image from its registry into the layer store and the image records: manifest
 * (through an index for the platform asked), config, then each layer blob not held
 * already (by diff_id or blob digest), streamed through the same layer pipeline as an
 * import (`readImageLayer`: hashed, extracted on the gateway's threads, built into EROFS).
 * Every digest is checked; nothing of a failed pull stays (ImageLayerSet). `signal` stops
 * it (the pull's lease was lost, the gateway stops): its error is the signal's reason.
 */
export async function pullImage(target: PullTarget, deps: ImagePullDeps, listener: PullListener, signal: AbortSignal): Promise<Image & { pull: ImportReport }> {
  const startedMs = performance.now();
  const { ref } = target;
  const owned = { ...deps, owner: target.owner };
  const repo = await deps.repository(ref, signal);
  const top = await repo.manifest();
  const manifestDigest = INDEX_MEDIA_TYPES.has(top.mediaType) ? manifestForPlatform(top.bytes, `image index ${ref.canonical}`, target.platform).digest : top.digest;
  const manifest = manifestDigest === top.digest ? top : await repo.manifest(manifestDigest);
  if (INDEX_MEDIA_TYPES.has(manifest.mediaType)) throw new RollboxError('invalid_image', `${ref.canonical}: the index names another index for ${target.platform}`);
  const parsed = parseImageManifest(manifest.bytes, `manifest ${manifest.digest}`);
  if (parsed.layers.length > MAX_STACK_LAYERS) throw new RollboxError('invalid_image', `the image has ${parsed.layers.length} layers; a sandbox stacks at most ${MAX_STACK_LAYERS}`);
  const { config, diffIds, platform } = imageConfigOf(await repo.blob(parsed.config.digest, CONFIG_MAX_BYTES), parsed.layers.length);
  // Through an index too: the config, not the index's word, is what the record keeps.
  checkPlatform(platform, target.platform);

  const progress: PullProgress = { layersTotal: parsed.layers.length, layersDone: 0, layersReused: 0, bytesTotal: parsed.layers.reduce((s, l) => s + (l.size ?? 0), 0), bytesDone: 0, bytesFetched: 0 };
  listener.planned(manifest.digest, { ...progress });
  const set = new ImageLayerSet(owned);
  // The first failure ends the pull: the other layers' blobs are cut off too.
  const failed = new AbortController();
  const stopped = AbortSignal.any([signal, failed.signal]);
  // A blob the image names twice is fetched once.
  const byBlob = new Map<string, Promise<ImageLayerBlob>>();
  const fetchLayer = async (d: Descriptor, diffId: string): Promise<ImageLayerBlob> => {
    stopped.throwIfAborted();
    const held = await heldLayer({ diffId, blobDigest: d.digest }, owned);
    if (held) {
      progress.layersReused++;
      progress.bytesDone += d.size ?? 0;
      return held;
    }
    if (d.size === undefined) throw new RollboxError('invalid_image', `manifest ${manifest.digest}: layer ${d.digest} has no size`);
    const sized = { ...d, size: d.size };
    const memory = deps.memory?.reserve(treeEstimateBytes(sized));
    try {
      return await fetchAndBuild(sized, memory);
    } catch (err) {
      if (!(err instanceof MemoryScratchFull)) throw err;
      return await fetchAndBuild(sized, undefined); // the blob again, its tree on disk
    } finally {
      memory?.release();
    }
  };
  const fetchAndBuild = async (d: Descriptor & { size: number }, memory: MemoryReservation | undefined): Promise<ImageLayerBlob> => {
    const blob = await repo.blobStream(d.digest, d.size);
    const stop = (): void => void blob.destroy(stopped.reason as Error);
    stopped.addEventListener('abort', stop, { once: true });
    let doneBytes = 0;
    try {
      const counted = tap((c) => {
        doneBytes += c.length;
        progress.bytesDone += c.length;
        progress.bytesFetched += c.length;
        listener.advanced({ ...progress });
      });
      pipeline(blob, counted).catch(() => undefined); // its error reaches the layer's reader through `counted`
      const { build } = await readImageLayer(counted, d.digest, `${ref.canonical} ${d.digest}`, owned, memory);
      return await build();
    } catch (err) {
      if (err instanceof MemoryScratchFull) progress.bytesDone -= doneBytes; // counted again by the next try
      throw err;
    } finally {
      blob.destroy();
      stopped.removeEventListener('abort', stop);
    }
  };

  try {
    const layers: ImageLayerBlob[] = new Array(parsed.layers.length);
    let next = 0;
    const worker = async (): Promise<void> => {
      while (next < parsed.layers.length) {
        const i = next++;
        const d = parsed.layers[i]!;
        let layer = byBlob.get(d.digest);
        if (!layer) {
          layer = set.add(fetchLayer(d, diffIds[i]!));
          byBlob.set(d.digest, layer);
        }
        layers[i] = await layer;
        if (layers[i]!.diffId !== diffIds[i]) throw new RollboxError('invalid_image', `layer ${d.digest}: its uncompressed tar hashes to ${layers[i]!.diffId}, the image config says ${diffIds[i]}`);
        progress.layersDone++;
        listener.advanced({ ...progress });
      }
    };
    const workers = Array.from({ length: Math.max(1, Math.min(deps.layerConcurrency, parsed.layers.length)) }, () =>
      worker().catch((err: unknown) => {
        failed.abort(err);
        throw err;
      }),
    );
    const settled = await Promise.allSettled(workers);
    const failure = settled.find((s): s is PromiseRejectedResult => s.status === 'rejected');
    if (failure) throw failure.reason;

    const image: Image = {
      name: target.name,
      digest: manifest.digest,
      platform,
      layers: layers.map((l) => ({ digest: l.digest, diffId: l.diffId, sizeBytes: l.sizeBytes })),
      config,
      sizeBytes: layers.reduce((s, l) => s + l.sizeBytes, 0),
      createdAt: new Date(deps.now()).toISOString(),
      ref: ref.canonical,
    };
    signal.throwIfAborted();
    await set.commit(image);
    const distinct = [...new Map(layers.map((l) => [l.digest, l])).values()];
    return {
      ...image,
      pull: { layersBuilt: distinct.filter((l) => !l.reused).length, layersReused: distinct.filter((l) => l.reused).length, archiveBytes: progress.bytesFetched, durationMs: Math.round(performance.now() - startedMs) },
    };
  } catch (err) {
    await set.abort();
    throw signal.aborted ? (signal.reason as Error) : err;
  } finally {
    await set.release();
  }
}
