import type { Redis } from 'ioredis';
import { Layer, RollboxError, type LayerDigest } from '../api/index.ts';
import { keys } from './keys.ts';
import { LuaScript } from '../redis/index.ts';
import { CLUSTER_OWNER, lookupKeys, ownedKey, rankOf, removableKeys, sees, splitKey, type Reader } from './owners.ts';

const DIGEST = /^sha256:[0-9a-f]{64}$/;

const FORGET_LAYER = new LuaScript(import.meta.dirname, 'forget-layer');

/**
 * Layer metadata (the registry); the images themselves live in the layer store. Each layer
 * has owners (owners.ts): a tenant reads, names, forks and downloads only the layers it owns
 * and the published ones; another's answer 404 as if they did not exist. Names are per
 * owner. The record itself (`get`) is for the gateway's own use (garbage collection,
 * lineage); what callers see goes through a Reader.
 */
export class LayerRegistry {
  constructor(private readonly redis: Redis) {}

  /** Records the layer (its first record is kept) and adds `owner` to its owners, with the name given in the owner's names. */
  async register(layer: Layer, owner: string): Promise<Layer> {
    const { name, published: _published, ...record } = layer;
    const multi = this.redis.multi().hsetnx(keys.layer(layer.digest), 'json', JSON.stringify(record)).sadd(keys.layers, layer.digest).sadd(keys.layerOwners(layer.digest), owner);
    if (name) multi.hset(keys.layerNames, ownedKey(owner, name), layer.digest);
    await multi.exec();
    const stored = (await this.get(layer.digest))!;
    return this.view(stored, name, await this.ownersOf(layer.digest));
  }

  /** The stored record, whoever owns it (the gateway's own use; callers read through `resolve`). */
  async get(digest: string): Promise<Layer | undefined> {
    const json = await this.redis.hget(keys.layer(digest), 'json');
    return json ? Layer.parse(JSON.parse(json)) : undefined;
  }

  async ownersOf(digest: string): Promise<string[]> {
    return this.redis.smembers(keys.layerOwners(digest));
  }

  /** Whether `reader` sees the layer (registered or not). */
  async visible(reader: Reader, digest: string): Promise<boolean> {
    return sees(reader, await this.ownersOf(digest));
  }

  /** A digest or a name (the reader's own, else the cluster's) to a layer the reader sees; anything else is a 404 naming the ref. */
  async resolve(ref: string, reader: Reader): Promise<Layer> {
    const byName = DIGEST.test(ref) ? undefined : (await this.redis.hmget(keys.layerNames, ...lookupKeys(reader, ref))).find((d): d is string => !!d);
    const digest = DIGEST.test(ref) ? ref : byName;
    const [layer, owners] = digest ? await Promise.all([this.get(digest), this.ownersOf(digest)]) : [undefined, []];
    if (!layer || !sees(reader, owners)) throw new RollboxError('not_found', `layer ${ref} not found`);
    return this.view(layer, byName ? ref : (await this.namesFor(reader)).get(layer.digest), owners);
  }

  async resolveAll(refs: readonly string[], reader: Reader): Promise<LayerDigest[]> {
    return Promise.all(refs.map(async (ref) => (await this.resolve(ref, reader)).digest));
  }

  /** Drops one of the reader's names (an admin's: also a cluster or owner-less one); the layer stays (unreferenced, garbage collection takes it later). */
  async unname(name: string, reader: Reader): Promise<Layer> {
    const fields = removableKeys(reader, name);
    const found = (await this.redis.hmget(keys.layerNames, ...fields)).findIndex((d) => !!d);
    if (found < 0) throw new RollboxError('not_found', `layer name ${name} not found`);
    const field = fields[found]!;
    const digest = (await this.redis.hget(keys.layerNames, field))!;
    await this.redis.hdel(keys.layerNames, field);
    const layer = await this.get(digest);
    if (!layer) throw new RollboxError('not_found', `layer ${digest} not found`);
    return this.view(layer, (await this.namesFor(reader)).get(digest), await this.ownersOf(digest));
  }

  /**
   * Publishes a layer cluster-wide (an operator's call): every tenant sees it from now on,
   * under `name` too when one is given (a cluster name: a tenant's own name comes first).
   */
  async publish(digest: string, name: string | undefined): Promise<Layer> {
    const multi = this.redis.multi().sadd(keys.layerOwners(digest), CLUSTER_OWNER);
    if (name) multi.hset(keys.layerNames, ownedKey(CLUSTER_OWNER, name), digest);
    await multi.exec();
    const layer = (await this.get(digest))!;
    return this.view(layer, name, await this.ownersOf(digest));
  }

  /** Takes a layer back from the cluster: its cluster names go, and only its owning tenants (if any) see it. */
  async unpublish(digest: string): Promise<Layer> {
    const clusterNames = Object.entries(await this.redis.hgetall(keys.layerNames)).filter(([k, d]) => d === digest && splitKey(k).owner === CLUSTER_OWNER).map(([k]) => k);
    const multi = this.redis.multi().srem(keys.layerOwners(digest), CLUSTER_OWNER);
    if (clusterNames.length) multi.hdel(keys.layerNames, ...clusterNames);
    await multi.exec();
    const layer = (await this.get(digest))!;
    return this.view(layer, undefined, await this.ownersOf(digest));
  }

  /** The record as a reader sees it: its name for it, whether it is published, no other owner's name. */
  private view(layer: Layer, name: string | undefined, owners: readonly string[]): Layer {
    const { name: _stored, published: _p, ...rest } = layer;
    return { ...rest, ...(name ? { name } : {}), published: owners.includes(CLUSTER_OWNER) };
  }

  /** digest -> the name a reader knows it by (its own first, then the cluster's, then for `all` readers any). */
  private async namesFor(reader: Reader): Promise<Map<string, string>> {
    const best = new Map<string, { name: string; rank: number }>();
    for (const [field, digest] of Object.entries(await this.redis.hgetall(keys.layerNames))) {
      const { owner, name } = splitKey(field);
      const r = rankOf(reader, owner);
      if (r >= 0 && (best.get(digest)?.rank ?? 3) > r) best.set(digest, { name, rank: r });
    }
    return new Map([...best].map(([d, b]) => [d, b.name]));
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
    return (await FORGET_LAYER.run(this.redis, [keys.layer(digest), keys.layers, keys.layerNames, keys.layerOwners(digest)], [digest])) === 1;
  }

  /** The layers a reader sees, oldest first. */
  async list(reader: Reader): Promise<Layer[]> {
    const digests = await this.redis.smembers(keys.layers);
    const [names, seen] = await Promise.all([
      this.namesFor(reader),
      Promise.all(digests.map(async (d) => {
        const [layer, owners] = await Promise.all([this.get(d), this.ownersOf(d)]);
        return layer && sees(reader, owners) ? this.view(layer, undefined, owners) : undefined;
      })),
    ]);
    return seen.filter((l): l is Layer => !!l).map((l) => ({ ...l, ...(names.has(l.digest) ? { name: names.get(l.digest)! } : {}) })).sort((a, b) => a.createdAt.localeCompare(b.createdAt));
  }
}
