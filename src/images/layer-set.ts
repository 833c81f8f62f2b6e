import { Image, RollboxError, issuesText } from '../api/index.ts';
import type { LayerStore } from '../layers/index.ts';
import type { ImageRegistry, LayerRegistry } from '../registry/index.ts';
import type { ImageLayerBlob, Owned } from './layer.ts';

/**
 * Which layers running imports and pulls hold: a failed one removes the layers it added
 * only when no other holds them (two imports of images on one new base build it once
 * each; the one that stored it first may be the one that fails).
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

/** What an import's or pull's layer set works with. */
export interface ImageLayerSetDeps {
  store: Pick<LayerStore, 'has' | 'putSplit' | 'remove'>;
  layers: Pick<LayerRegistry, 'register' | 'get' | 'visible' | 'pin' | 'unpin' | 'forget' | 'resolve'>;
  images: Pick<ImageRegistry, 'diffIdOfBlob' | 'layerOfDiffId' | 'remember' | 'put' | 'layerDigests'>;
  /** Layers the imports running in this process hold (one instance per gateway). */
  holds: ImportHolds;
}

/**
 * The layers one import or pull builds or finds stored, and what becomes of them: the one
 * place where "a layer blob became a stored layer" turns into an image record or is undone.
 * `commit` records the image (its layers referenced from then on; built ones it does not
 * use removed); `abort` removes what it added that nothing else uses; `release` always ends.
 */
export class ImageLayerSet {
  private readonly layers: Promise<ImageLayerBlob>[] = [];

  constructor(private readonly deps: ImageLayerSetDeps & Owned) {}

  /** A layer being built (or found stored): held by this import from when it is. */
  add(layer: Promise<ImageLayerBlob>): Promise<ImageLayerBlob> {
    const held = layer.then((l) => {
      this.deps.holds.take(l.digest);
      return l;
    });
    held.catch(() => undefined); // awaited by the caller; not an unhandled rejection meanwhile
    this.layers.push(held);
    return held;
  }

  /** Records the image: only one its readers can parse (checked with the schema they read it with), else `invalid_image` naming the field. */
  async commit(image: Image): Promise<void> {
    const checked = Image.safeParse(image);
    if (!checked.success) throw new RollboxError('invalid_image', `image ${image.name}: ${issuesText(checked.error)}`);
    const used = new Set(image.layers.map((l) => l.digest));
    // Layers of other platforms or images of an archive: built, but nothing uses them.
    await this.remove((await Promise.all(this.layers)).filter((l) => !used.has(l.digest)));
    await this.deps.images.put(this.deps.owner, image);
    // The image record references them now.
    await Promise.all([...used].map((d) => this.deps.layers.unpin(d)));
  }

  async abort(): Promise<void> {
    await this.remove(await this.settled());
  }

  async release(): Promise<void> {
    for (const layer of await this.settled()) this.deps.holds.release(layer.digest);
  }

  private async settled(): Promise<ImageLayerBlob[]> {
    return (await Promise.allSettled(this.layers)).flatMap((s) => (s.status === 'fulfilled' ? [s.value] : []));
  }

  /**
   * Unpins the layers and removes the ones this set added, unless an image or another
   * running import uses them (the pin is shared: another import's pin goes too, but its
   * hold keeps the layer, and its image record protects it from then on).
   */
  private async remove(layers: readonly ImageLayerBlob[]): Promise<void> {
    if (layers.length === 0) return;
    const inImages = new Set(await this.deps.images.layerDigests());
    for (const layer of layers) {
      if (this.deps.holds.heldByOthers(layer.digest) || inImages.has(layer.digest)) continue;
      await this.deps.layers.unpin(layer.digest);
      if (!layer.added) continue;
      await this.deps.layers.forget(layer.digest);
      await this.deps.store.remove(layer.digest);
    }
  }
}
