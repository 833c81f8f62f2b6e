import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { Image, MAX_STACK_LAYERS, RollboxError, baseOf, type ImageSpec, type LayerDigest } from '../api/index.ts';
import { keys } from './keys.ts';
import type { LayerRegistry } from './layers.ts';
import { layerDigestsIn, parseRecord } from './record-check.ts';

/** Imported images (name -> layers and config), and which EROFS layer each image layer became. */
export class ImageRegistry {
  constructor(
    private readonly redis: Redis,
    private readonly layers: Pick<LayerRegistry, 'resolveAll' | 'get'>,
    private readonly logger?: Pick<Logger, 'warn'>,
  ) {}

  async put(image: Image): Promise<void> {
    await this.redis.hset(keys.images, image.name, JSON.stringify(image));
  }

  /** A record that does not parse (written by an older version under looser rules) is `invalid_image`, saying how to remove it. */
  async get(name: string): Promise<Image | undefined> {
    const json = await this.redis.hget(keys.images, name);
    if (!json) return undefined;
    const parsed = parseRecord(Image, json);
    if (parsed.ok) return parsed.value;
    throw new RollboxError('invalid_image', `image ${name}: its stored record is invalid (${parsed.issues}); DELETE /v1/images/${name} removes it`);
  }

  async getOrThrow(name: string): Promise<Image> {
    const image = await this.get(name);
    if (!image) throw new RollboxError('not_found', `image ${name} not found`);
    return image;
  }

  /** Every image whose record parses; one that does not is left out (and logged), not the listing's failure. */
  async list(): Promise<Image[]> {
    const all = Object.entries(await this.redis.hgetall(keys.images)).flatMap(([name, json]) => {
      const parsed = parseRecord(Image, json);
      if (!parsed.ok) this.logger?.warn({ image: name, issues: parsed.issues }, 'image record invalid: left out (DELETE /v1/images/:name removes it)');
      return parsed.ok ? [parsed.value] : [];
    });
    return all.sort((a, b) => a.name.localeCompare(b.name));
  }

  /** Removes the record, valid or not (undefined: it was invalid); its layers stay while anything else references them (layer garbage collection). */
  async delete(name: string): Promise<Image | undefined> {
    const json = await this.redis.hget(keys.images, name);
    if (!json) throw new RollboxError('not_found', `image ${name} not found`);
    await this.redis.hdel(keys.images, name);
    const parsed = parseRecord(Image, json);
    return parsed.ok ? parsed.value : undefined;
  }

  /**
   * Every layer of every image (roots for layer garbage collection), read from invalid
   * records too: a record that does not parse still keeps the layers it names.
   */
  async layerDigests(): Promise<string[]> {
    return [...new Set(Object.values(await this.redis.hgetall(keys.images)).flatMap(layerDigestsIn))];
  }

  /** The EROFS layer an image layer became, by diff_id, if it is still registered. */
  async layerOfDiffId(diffId: string): Promise<LayerDigest | undefined> {
    const digest = await this.redis.hget(keys.imageDiffIds, diffId);
    return digest && (await this.layers.get(digest)) ? digest : undefined;
  }

  async diffIdOfBlob(blobDigest: string): Promise<string | undefined> {
    return (await this.redis.hget(keys.imageBlobs, blobDigest)) ?? undefined;
  }

  async remember(diffId: string, layerDigest: string, blobDigest: string | undefined): Promise<void> {
    const multi = this.redis.multi().hset(keys.imageDiffIds, diffId, layerDigest);
    if (blobDigest) multi.hset(keys.imageBlobs, blobDigest, diffId);
    await multi.exec();
  }

  /** What a name stands for in a synced layer set: an imported image's layers, else the one layer (a name or digest). */
  async layersOf(ref: string): Promise<LayerDigest[]> {
    const image = await this.get(ref);
    return image ? image.layers.map((l) => l.digest) : this.layers.resolveAll([ref]);
  }

  /**
   * The layers of a create's image, lowest first: an imported image's layers when `base`
   * names one (image names come before layer names), then the extra layers on top.
   */
  async resolveStack(spec: Pick<ImageSpec, 'base' | 'layers'>): Promise<{ layerDigests: LayerDigest[]; image?: Image }> {
    const base = baseOf(spec);
    const image = await this.get(base);
    const extra = await this.layers.resolveAll(image ? spec.layers : [base, ...spec.layers]);
    const layerDigests = [...(image?.layers.map((l) => l.digest) ?? []), ...extra];
    if (layerDigests.length > MAX_STACK_LAYERS) {
      throw new RollboxError('invalid_request', `image: ${layerDigests.length} layers${image ? ` (image ${image.name} has ${image.layers.length})` : ''}; a sandbox stacks at most ${MAX_STACK_LAYERS}`);
    }
    return image ? { layerDigests, image } : { layerDigests };
  }
}
