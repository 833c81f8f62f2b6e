import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { Image, MAX_STACK_LAYERS, RollboxError, baseOf, type ImageSpec, type LayerDigest } from '../api/index.ts';
import { keys } from './keys.ts';
import type { LayerRegistry } from './layers.ts';
import { CLUSTER_OWNER, OPERATOR, lookupKeys, ownedKey, rankOf, splitKey, type Reader } from './owners.ts';
import { layerDigestsIn, parseRecord } from './record-check.ts';

/**
 * Imported and pulled images (name -> layers and config), and which EROFS layer each image
 * layer became. Names are per owner (owners.ts): a tenant's own, else the cluster's
 * (published), each under `<owner>/<name>`; a reader never sees another tenant's.
 */
export class ImageRegistry {
  constructor(
    private readonly redis: Redis,
    private readonly layers: Pick<LayerRegistry, 'resolveAll' | 'get'>,
    private readonly logger?: Pick<Logger, 'warn'>,
  ) {}

  async put(owner: string, image: Image): Promise<void> {
    const { published: _p, ...record } = image;
    await this.redis.hset(keys.images, ownedKey(owner, image.name), JSON.stringify(record));
  }

  /** The field and record a reader's name stands for (its own first, then the cluster's). */
  async find(reader: Reader, name: string): Promise<{ key: string; json: string } | undefined> {
    const fields = lookupKeys(reader, name);
    const found = (await this.redis.hmget(keys.images, ...fields)).findIndex((j) => !!j);
    return found < 0 ? undefined : { key: fields[found]!, json: (await this.redis.hget(keys.images, fields[found]!))! };
  }

  /** A record that does not parse (written by an older version under looser rules) is `invalid_image`, saying how to remove it. */
  async get(reader: Reader, name: string): Promise<Image | undefined> {
    const found = await this.find(reader, name);
    return found && this.parsedOrThrow(name, found);
  }

  async getOrThrow(reader: Reader, name: string): Promise<Image> {
    const image = await this.get(reader, name);
    if (!image) throw new RollboxError('not_found', `image ${name} not found`);
    return image;
  }

  /** The image stored under one field (`<owner>/<name>`), no fallback. */
  async getAt(key: string): Promise<Image | undefined> {
    const json = await this.redis.hget(keys.images, key);
    return json ? this.parsedOrThrow(splitKey(key).name, { key, json }) : undefined;
  }

  private parsedOrThrow(name: string, found: { key: string; json: string }): Image {
    const parsed = parseRecord(Image, found.json);
    if (!parsed.ok) throw new RollboxError('invalid_image', `image ${name}: its stored record is invalid (${parsed.issues}); DELETE /v1/images/${name} removes it`);
    return { ...parsed.value, published: splitKey(found.key).owner === CLUSTER_OWNER };
  }

  /**
   * Every image a reader sees, by name (its own shadows the cluster's of the same name);
   * one whose record does not parse is left out (and logged), not the listing's failure.
   */
  async list(reader: Reader): Promise<Image[]> {
    const byName = new Map<string, { rank: number; image: Image }>();
    for (const [key, json] of Object.entries(await this.redis.hgetall(keys.images))) {
      const { owner, name } = splitKey(key);
      const rank = rankOf(reader, owner);
      if (rank < 0 || (byName.get(name)?.rank ?? 3) <= rank) continue;
      const parsed = parseRecord(Image, json);
      if (!parsed.ok) this.logger?.warn({ image: key, issues: parsed.issues }, 'image record invalid: left out (DELETE /v1/images/:name removes it)');
      else byName.set(name, { rank, image: { ...parsed.value, published: owner === CLUSTER_OWNER } });
    }
    return [...byName.values()].map((v) => v.image).sort((a, b) => a.name.localeCompare(b.name));
  }

  /** Whether a record (valid or not) is stored under the field. */
  async has(key: string): Promise<boolean> {
    return (await this.redis.hexists(keys.images, key)) === 1;
  }

  /** Removes the record under the field, valid or not; its layers stay while anything else references them (layer garbage collection). Answers whether there was one. */
  async deleteAt(key: string): Promise<boolean> {
    return (await this.redis.hdel(keys.images, key)) === 1;
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

  /**
   * What a name stands for in a synced layer set (the operator's config, which names images
   * across tenants): the cluster's image of that name, an owner-qualified `<tenant>/<name>`,
   * else every tenant's image of that name, else the one layer (a name or digest).
   */
  async layersOf(ref: string): Promise<LayerDigest[]> {
    const image = (await this.get(OPERATOR, ref)) ?? (ref.includes('/') ? await this.getAt(ref) : undefined);
    if (image) return image.layers.map((l) => l.digest);
    const tenants = Object.entries(await this.redis.hgetall(keys.images)).filter(([key]) => splitKey(key).name === ref);
    const digests = tenants.flatMap(([, json]) => {
      const parsed = parseRecord(Image, json);
      return parsed.ok ? parsed.value.layers.map((l) => l.digest) : [];
    });
    return digests.length > 0 ? [...new Set(digests)] : this.layers.resolveAll([ref], OPERATOR);
  }

  /**
   * The layers of a create's image, lowest first: an imported image's layers when `base`
   * names one the reader sees (image names come before layer names), then the extra layers
   * on top, each one the reader sees (another tenant's answers 404).
   */
  async resolveStack(spec: Pick<ImageSpec, 'base' | 'layers'>, reader: Reader): Promise<{ layerDigests: LayerDigest[]; image?: Image }> {
    const base = baseOf(spec);
    const image = await this.get(reader, base);
    const extra = await this.layers.resolveAll(image ? spec.layers : [base, ...spec.layers], reader);
    const layerDigests = [...(image?.layers.map((l) => l.digest) ?? []), ...extra];
    if (layerDigests.length > MAX_STACK_LAYERS) {
      throw new RollboxError('invalid_request', `image: ${layerDigests.length} layers${image ? ` (image ${image.name} has ${image.layers.length})` : ''}; a sandbox stacks at most ${MAX_STACK_LAYERS}`);
    }
    return image ? { layerDigests, image } : { layerDigests };
  }
}
