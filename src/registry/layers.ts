import type { Redis } from 'ioredis';
import { Layer, RollboxError, type LayerDigest } from '../api/index.ts';
import { keys } from './keys.ts';

const DIGEST = /^sha256:[0-9a-f]{64}$/;

/** Layer metadata (the registry); the images themselves live in the layer store. */
export class LayerRegistry {
  constructor(private readonly redis: Redis) {}

  async register(layer: Layer): Promise<Layer> {
    const multi = this.redis.multi().hsetnx(keys.layer(layer.digest), 'json', JSON.stringify(layer)).sadd(keys.layers, layer.digest);
    if (layer.name) multi.hset(keys.layerNames, layer.name, layer.digest);
    await multi.exec();
    // A re-upload of the same content keeps its first record, but may give it a new name.
    const stored = (await this.get(layer.digest))!;
    if (layer.name && stored.name !== layer.name) {
      const renamed = { ...stored, name: layer.name };
      await this.redis.hset(keys.layer(layer.digest), 'json', JSON.stringify(renamed));
      return renamed;
    }
    return stored;
  }

  async get(digest: string): Promise<Layer | undefined> {
    const json = await this.redis.hget(keys.layer(digest), 'json');
    return json ? Layer.parse(JSON.parse(json)) : undefined;
  }

  /** A digest or a name to a registered layer; unknown ones are a 404 naming the ref. */
  async resolve(ref: string): Promise<Layer> {
    const digest = DIGEST.test(ref) ? ref : await this.redis.hget(keys.layerNames, ref);
    const layer = digest ? await this.get(digest) : undefined;
    if (!layer) throw new RollboxError('not_found', `layer ${ref} not found`);
    return layer;
  }

  async resolveAll(refs: readonly string[]): Promise<LayerDigest[]> {
    return Promise.all(refs.map(async (ref) => (await this.resolve(ref)).digest));
  }

  async list(): Promise<Layer[]> {
    const digests = await this.redis.smembers(keys.layers);
    const layers = await Promise.all(digests.map((d) => this.get(d)));
    return layers.filter((l): l is Layer => !!l).sort((a, b) => a.createdAt.localeCompare(b.createdAt));
  }
}
