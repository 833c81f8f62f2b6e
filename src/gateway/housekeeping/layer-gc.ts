import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { isTerminal } from '../../api/index.ts';
import type { LayerStore } from '../../layers/index.ts';
import { PrefetchLists, keys, type ImageRegistry, type LayerRegistry, type SandboxRegistry } from '../../registry/index.ts';

export interface LayerCollectorDeps {
  redis: Redis;
  layers: LayerRegistry;
  sandboxes: Pick<SandboxRegistry, 'layersInUse' | 'get'>;
  images: Pick<ImageRegistry, 'layerDigests'>;
  store: Pick<LayerStore, 'list' | 'storedAtMs' | 'remove' | 'listHibernated' | 'removeHibernated' | 'listForkImages' | 'removeForkImage'>;
  /** A layer goes only after it has stayed unreferenced this long. */
  graceMs: number;
  logger: Logger;
  now: () => number;
}

const LOCK_MS = 60_000;
/**
 * A fork's image (one that keeps processes) is removed by its gateway once the children
 * started; one older than this was left by a gateway (or a worker mid-save) that died. Far
 * longer than a fork takes: its save and its children's starts are bounded by minutes.
 */
export const FORK_IMAGE_MAX_AGE_MS = 30 * 60_000;

/**
 * Layer garbage collection. Referenced: the layers (and the hibernation layer) of every
 * sandbox not yet terminated, every named layer, every imported image's layers, layers pinned between their image
 * landing in the store and the record that uses them (snapshot, hibernation; see
 * LayerRegistry.pin), and the parents (lineage) of anything referenced. Everything else known to the registry or present in the layer store is a
 * candidate from the first pass that sees it unreferenced, and is removed (record, then
 * image) once it has stayed unreferenced for `graceMs` and its image was not stored again
 * meanwhile. The grace covers the moments a reference is about to appear, like a layer
 * just uploaded before the create that names it.
 *
 * Worker hosts sharing the store need nothing: a layer mount is refcounted and unmounted
 * when its last sandbox on the host releases it, and a referenced layer is never collected.
 * Hosts with a chunk cache of lazy layers remove the files of layers the registry forgot
 * on their own (LazyLayers.collect).
 */
export class LayerCollector {
  constructor(private readonly deps: LayerCollectorDeps) {}

  /** One pass (one gateway at a time, through a Redis lock). Returns the digests removed. */
  async collect(): Promise<string[]> {
    const { redis, layers, store, graceMs, now } = this.deps;
    const lock = keys.lock('layer-gc');
    if (!(await redis.set(lock, '1', 'PX', LOCK_MS, 'NX'))) return [];
    try {
      const { registered, named } = await layers.digests();
      const referenced = await this.referenced(named);
      const known = new Set([...registered, ...(await store.list())]);
      const unreferenced = [...known].filter((d) => !referenced.has(d));
      const nowMs = now();
      const seen = await redis.zrange(keys.layerGcCandidates, '0', '-1', 'WITHSCORES');
      const firstSeen = new Map<string, number>();
      for (let i = 0; i < seen.length; i += 2) firstSeen.set(seen[i]!, Number(seen[i + 1]));
      const stale = [...firstSeen.keys()].filter((d) => referenced.has(d) || !known.has(d));
      const fresh = unreferenced.filter((d) => !firstSeen.has(d));
      const update = redis.multi();
      if (stale.length) update.zrem(keys.layerGcCandidates, ...stale);
      for (const d of fresh) update.zadd(keys.layerGcCandidates, 'NX', String(nowMs), d);
      await update.exec();

      const removed: string[] = [];
      for (const digest of unreferenced) {
        const since = firstSeen.get(digest);
        if (since === undefined || nowMs - since < graceMs) continue;
        if (nowMs - ((await store.storedAtMs(digest)) ?? 0) < graceMs) continue;
        if (!(await layers.forget(digest))) continue; // named meanwhile
        await store.remove(digest);
        await new PrefetchLists(redis).forget(digest);
        await redis.zrem(keys.layerGcCandidates, digest);
        removed.push(digest);
      }
      if (removed.length) this.deps.logger.info({ layers: removed }, 'unreferenced layers collected');
      await this.collectHibernatedImages();
      await this.collectForkImages();
      return removed;
    } finally {
      await redis.del(lock);
    }
  }

  /**
   * The images of microVMs hibernated whole whose sandbox has ended (deleted, expired, failed)
   * or is gone. A live sandbox's image stays: it is being written, waited on, or about to be
   * removed by the wake that restored it.
   */
  private async collectHibernatedImages(): Promise<void> {
    const { store, sandboxes } = this.deps;
    for (const id of await store.listHibernated()) {
      const sandbox = await sandboxes.get(id);
      if (sandbox && !isTerminal(sandbox.state)) continue;
      await store.removeHibernated(id);
      this.deps.logger.info({ sandboxId: id }, 'hibernated microVM image of an ended sandbox removed');
    }
  }

  /** Fork images (and parts of ones) left behind: older than any fork in progress. */
  private async collectForkImages(): Promise<void> {
    const { store, now } = this.deps;
    for (const image of await store.listForkImages()) {
      if (now() - image.changedAtMs < FORK_IMAGE_MAX_AGE_MS) continue;
      await store.removeForkImage(image.name);
      this.deps.logger.info({ forkImage: image.name }, 'fork image left behind removed');
    }
  }

  private async referenced(named: readonly string[]): Promise<Set<string>> {
    const { layers } = this.deps;
    const roots = new Set([...named, ...(await layers.pinned(this.deps.now())), ...(await this.deps.images.layerDigests())]);
    for (const digest of await this.deps.sandboxes.layersInUse()) roots.add(digest);
    // Lineage: a referenced layer keeps its parents.
    const referenced = new Set<string>();
    const queue = [...roots];
    while (queue.length) {
      const digest = queue.pop()!;
      if (referenced.has(digest)) continue;
      referenced.add(digest);
      for (const parent of (await layers.get(digest))?.parents ?? []) if (!referenced.has(parent)) queue.push(parent);
    }
    return referenced;
  }
}
