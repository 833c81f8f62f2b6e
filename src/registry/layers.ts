import type { Redis } from 'ioredis';
import { Layer, RollboxError, type LayerDigest } from '../api/index.ts';
import { keys } from './keys.ts';
import { LuaScript } from '../redis/index.ts';

const DIGEST = /^sha256:[0-9a-f]{64}$/;

const FORGET_LAYER = new LuaScript(import.meta.dirname, 'forget-layer');

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

  /** Drops a name; the layer stays (unreferenced, garbage collection takes it later). */
  async unname(name: string): Promise<Layer> {
    const digest = await this.redis.hget(keys.layerNames, name);
    if (!digest) throw new RollboxError('not_found', `layer name ${name} not found`);
    await this.redis.hdel(keys.layerNames, name);
    const layer = await this.get(digest);
    if (!layer) throw new RollboxError('not_found', `layer ${digest} not found`);
    if (layer.name !== name) return layer;
    // The record shows one of its names: another one if it has more, else none.
    const other = Object.entries(await this.redis.hgetall(keys.layerNames)).find(([, d]) => d === digest)?.[0];
    const { name: _dropped, ...rest } = layer;
    const updated: Layer = other ? { ...rest, name: other } : rest;
    await this.redis.hset(keys.layer(digest), 'json', JSON.stringify(updated));
    return updated;
  }

  /**
   * Keeps a just-stored layer from garbage collection until the record that uses it is
   * written (a hibernated sandbox's, a snapshot's), or until `untilMs` if that never happens.
   */
  async pin(digest: string, untilMs: number): Promise<void> {
    await this.redis.zadd(keys.layerPins, String(untilMs), digest);
  }

  async unpin(digest: string): Promise<void> {
    await this.redis.zrem(keys.layerPins, digest);
  }

  /** Layers pinned now (lapsed pins are dropped). */
  async pinned(nowMs: number): Promise<string[]> {
    await this.redis.zremrangebyscore(keys.layerPins, '-inf', String(nowMs));
    return this.redis.zrange(keys.layerPins, '0', '-1');
  }

  /** Digests of every registered layer and of every named one. */
  async digests(): Promise<{ registered: string[]; named: string[] }> {
    const [registered, named] = await Promise.all([this.redis.smembers(keys.layers), this.redis.hvals(keys.layerNames)]);
    return { registered, named };
  }

  /**
   * Removes a layer's record unless a name points to it (checked and done in one script,
   * so a name given meanwhile keeps it). Returns whether it was removed.
   */
  async forget(digest: string): Promise<boolean> {
    return (await FORGET_LAYER.run(this.redis, [keys.layer(digest), keys.layers, keys.layerNames], [digest])) === 1;
  }

  async list(): Promise<Layer[]> {
    const digests = await this.redis.smembers(keys.layers);
    const layers = await Promise.all(digests.map((d) => this.get(d)));
    return layers.filter((l): l is Layer => !!l).sort((a, b) => a.createdAt.localeCompare(b.createdAt));
  }
}
