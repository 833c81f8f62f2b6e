import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import path from 'node:path';
import { Writable, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { RollboxError } from '../api/index.ts';
import { MemoryScratchFull, extractInThread, outgrewReservation, splitFilesIn, storeTreeAsLayer, tap, type LayerBuildMode, type LayerStore, type MemoryReservation, type TarExtractor } from '../layers/index.ts';
import type { LayerTarget, StoredLayer, TarRead } from '../layers/index.ts';
import type { ImageRegistry, LayerRegistry } from '../registry/index.ts';

export interface ImageLayerDeps {
  store: Pick<LayerStore, 'has' | 'putSplit'>;
  layers: Pick<LayerRegistry, 'register' | 'get' | 'visible' | 'pin'>;
  images: Pick<ImageRegistry, 'diffIdOfBlob' | 'layerOfDiffId' | 'remember'>;
  tmpDir: string;
  /** Cap on one layer's file contents. */
  maxLayerBytes: number;
  /** Cap on one layer's tar entries (default 2,000,000). */
  maxLayerEntries?: number;
  now: () => number;
  /** Default: in this thread (a gateway passes its ExtractWorkers). */
  extract?: TarExtractor;
  /** Default `direct` (see LayerBuildMode). */
  build?: LayerBuildMode;
}

/** Whose import or pull it is: the layers it stores or reuses become the owner's (src/registry/owners.ts). */
export interface Owned {
  owner: string;
}

export interface ImageLayerBlob {
  diffId: string;
  digest: string;
  sizeBytes: number;
  /** Found stored already (the same layer in an earlier image): not built again. */
  reused: boolean;
  /** This import put the EROFS image in the store (removed again if the import fails). */
  added: boolean;
}

/** Layer tars of real images hold far more entries than hand-made layers. */
const MAX_LAYER_ENTRIES = 2_000_000;
/** A layer stays out of garbage collection this long while its image's import runs. */
const IMPORT_PIN_MS = 6 * 3600 * 1000;

/**
 * The EROFS layer an image layer (by diff_id) became, if it is stored still and the owner
 * sees it: pinned for the import using it. Another tenant's layer is reused only once this
 * import has read the content itself (`proven`: its tar hashed to the diff_id), and then it
 * becomes this owner's too; a digest named in a manifest or archive proves nothing (a
 * hostile registry could name another tenant's blob), so that layer is fetched and built.
 */
async function storedLayer(diffId: string, deps: ImageLayerDeps & Owned, proven: boolean): Promise<ImageLayerBlob | undefined> {
  const digest = await deps.images.layerOfDiffId(diffId);
  if (!digest || (!proven && !(await deps.layers.visible({ tenant: deps.owner, all: false }, digest)))) return undefined;
  // Pinned first: every garbage collection pass from now on keeps it (one already past its pin check could still take it; then it is built again next time).
  await deps.layers.pin(digest, deps.now() + IMPORT_PIN_MS);
  const layer = (await deps.store.has(digest)) ? await deps.layers.get(digest) : undefined;
  if (layer && proven) await deps.layers.register(layer, deps.owner);
  return layer && { diffId, digest: layer.digest, sizeBytes: layer.sizeBytes, reused: true, added: false };
}

/**
 * A layer held already, by its uncompressed content (diff_id) or its blob's digest (an
 * earlier import or pull of that blob): found, it need not be read (a pull) or only read
 * through and checked (an archive).
 */
export async function heldLayer(key: { diffId?: string; blobDigest?: string }, deps: ImageLayerDeps & Owned): Promise<ImageLayerBlob | undefined> {
  const byContent = key.diffId ? await storedLayer(key.diffId, deps, false) : undefined;
  if (byContent) return byContent;
  const diffId = key.blobDigest ? await deps.images.diffIdOfBlob(key.blobDigest) : undefined;
  return diffId ? storedLayer(diffId, deps, false) : undefined;
}

/**
 * One layer blob of an archive or a registry, in two steps so the next blob can be read while this one's
 * EROFS image is built: `read` consumes the blob (hashing it; extracting it unless the same
 * blob or the same uncompressed content is stored already) and answers `build`, which makes
 * and stores the EROFS image. Both digests are checked: the blob's against the name the
 * archive gives it, the uncompressed tar's (diff_id) later against the image config.
 * With `memory` (a pull's reservation on a tmpfs) the tree is extracted there and only the
 * EROFS image reaches the disk; a tree that outgrows it fails `MemoryScratchFull`.
 */
export async function readImageLayer(blob: Readable, claimedDigest: string | undefined, archivePath: string, deps: ImageLayerDeps & Owned, memory?: MemoryReservation): Promise<{ build: () => Promise<ImageLayerBlob> }> {
  const blobHash = createHash('sha256');
  // Joined before anything awaits: an error of the blob, now or later, reaches whoever reads `hashed`.
  const hashed = tap((c) => blobHash.update(c));
  pipeline(blob, hashed).catch(() => undefined);
  const checkBlobDigest = (): void => {
    const got = `sha256:${blobHash.digest('hex')}`;
    if (claimedDigest && got !== claimedDigest) throw new RollboxError('invalid_image', `blob ${archivePath}: its bytes hash to ${got}`);
  };
  // The same blob in an earlier image: only read through (the archive is one stream) and checked.
  const known = claimedDigest ? await heldLayer({ blobDigest: claimedDigest }, deps) : undefined;
  if (known) {
    await pipeline(hashed, new Writable({ write: (_c, _e, done) => done() }));
    checkBlobDigest();
    return { build: async () => known };
  }

  await mkdir(deps.tmpDir, { recursive: true });
  const work = await mkdtemp(path.join(deps.tmpDir, 'image-layer-'));
  const limits = { maxBytes: memory ? Math.min(deps.maxLayerBytes, memory.bytes) : deps.maxLayerBytes, maxEntries: deps.maxLayerEntries ?? MAX_LAYER_ENTRIES };
  const read = async (target: LayerTarget): Promise<TarRead> => {
    const got = await (deps.extract ?? extractInThread)(hashed, target, limits, { imageLayer: true }).catch((err: unknown) => {
      if (memory && outgrewReservation(err, memory.bytes, deps.maxLayerBytes)) throw new MemoryScratchFull(memory.bytes);
      if (err instanceof RollboxError && err.code === 'invalid_layer') throw new RollboxError('invalid_layer', `layer ${archivePath}: ${err.message}`);
      throw err;
    });
    checkBlobDigest();
    return got;
  };
  const stored = async (diffId: string, put: () => Promise<StoredLayer & { added: boolean }>): Promise<ImageLayerBlob> => {
    // The same content compressed another way, or an older docker save naming layers by id.
    const again = await storedLayer(diffId, deps, true);
    if (again) return again;
    const layer = await put();
    await deps.layers.pin(layer.digest, deps.now() + IMPORT_PIN_MS);
    await deps.layers.register({ digest: layer.digest, sizeBytes: layer.sizeBytes, parents: [], createdAt: new Date(deps.now()).toISOString() }, deps.owner);
    await deps.images.remember(diffId, layer.digest, claimedDigest);
    return { diffId, digest: layer.digest, sizeBytes: layer.sizeBytes, reused: false, added: layer.added };
  };

  if ((deps.build ?? 'direct') === 'direct') {
    // Written as it streams in, in its final form: `build` only moves it into the store.
    const files = splitFilesIn(work);
    let got: TarRead;
    try {
      got = await read({ kind: 'erofs', files });
    } catch (err) {
      await rm(work, { recursive: true, force: true });
      throw err;
    }
    return {
      build: async () => {
        try {
          return await stored(`sha256:${got.tarSha256}`, () => deps.store.putSplit({ ...files, ...(got.table ? { table: got.table } : {}) }));
        } finally {
          await rm(work, { recursive: true, force: true });
        }
      },
    };
  }

  // The tree goes to memory if it may; the EROFS image is built in `work` (beside the store).
  const treeDir = memory ? await mkdtemp(path.join(memory.dir, 'rollbox-layer-')) : work;
  const root = path.join(treeDir, 'root');
  const removeWork = async (): Promise<void> => {
    await rm(work, { recursive: true, force: true });
    if (treeDir !== work) await rm(treeDir, { recursive: true, force: true });
  };
  let diffId: string;
  try {
    await mkdir(root, { mode: 0o755 });
    diffId = `sha256:${(await read({ kind: 'tree', root })).tarSha256}`;
  } catch (err) {
    await removeWork();
    throw err;
  }
  return {
    build: async () => {
      try {
        // Image layers keep their xattrs: capabilities, ACLs and the overlay's opaque marks.
        return await stored(diffId, () => storeTreeAsLayer(root, work, deps.store, { keepXattrs: true }));
      } finally {
        await removeWork();
      }
    },
  };
}
