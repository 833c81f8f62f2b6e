import { statfsSync } from 'node:fs';
import path from 'node:path';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { Config } from './config/index.ts';
import { fetchLayers, type LayerFiles, type LayerStore } from './layers/index.ts';
import { LazyLayers } from './layers/lazy/index.ts';
import { ImageRegistry, LayerRegistry, PrefetchLists, keys } from './registry/index.ts';

/**
 * Part of the composition root (main.ts), built from config. Where this host's layers come from: its store, and for what the store lacks (a host that
 * shares no layer store with the cluster), its gateway: a lazy layer's metadata (data
 * chunks fetched as they are read) or, with ROLLBOX_LAYER_FETCH=full and for single-image
 * layers, the whole layer copied into the store first.
 */
export function layerSourceOf(config: Config, redis: Redis, store: LayerStore, workerDir: string, logger: Logger, onUnsafe: (digests: string[]) => Promise<void>): { layerFiles: (digest: string) => Promise<LayerFiles | undefined>; lazy?: LazyLayers } {
  const { gatewayUrl, gatewayToken } = config.node;
  if (!gatewayUrl || !gatewayToken) return { layerFiles: (digest) => store.locate(digest) };
  const tmpDir = path.join(workerDir, 'tmp');
  const copying = new Map<string, Promise<unknown>>();
  const copyWhole = async (digest: string): Promise<LayerFiles | undefined> => {
    let p = copying.get(digest);
    if (!p) {
      p = fetchLayers([digest], { gatewayUrl, token: gatewayToken, store, tmpDir }).finally(() => copying.delete(digest));
      copying.set(digest, p);
    }
    await p;
    return store.locate(digest);
  };
  if (config.node.layerFetch === 'full') return { layerFiles: async (digest) => (await store.locate(digest)) ?? copyWhole(digest) };
  const registry = new LayerRegistry(redis);
  const { lazy: opts } = config.node;
  const lazy = new LazyLayers({
    cacheDir: path.join(workerDir, 'lazy'),
    gateDir: path.join(workerDir, 'gate'),
    origin: { gatewayUrl, token: gatewayToken, timeoutMs: opts.fetchTimeoutMs, busyRetryMs: opts.readTimeoutMs },
    limitBytes: (opts.cacheMaxMiB ?? defaultCacheMiB(config.dataDir)) * 1024 * 1024,
    graceMs: opts.graceMs,
    eventTimeoutMs: opts.readTimeoutMs,
    concurrency: opts.fetchConcurrency,
    prefetch: opts.prefetch,
    prefetchStore: new PrefetchLists(redis, opts.prefetchRuns),
    prefetchWindowMs: opts.prefetchWindowMs,
    readaheadChunks: opts.readaheadChunks,
    layerKnown: async (digest) => (await registry.get(digest)) !== undefined,
    layerSizeBytes: async (digest) => (await store.has(digest) ? 0 : (await registry.get(digest))?.sizeBytes),
    onUnsafe,
    logger,
  });
  return { lazy, layerFiles: async (digest) => (await store.locate(digest)) ?? (await lazy.files(digest)) ?? copyWhole(digest) };
}

/** A quarter of the data dir's filesystem, at most 64 GiB. */
function defaultCacheMiB(dataDir: string): number {
  try {
    const s = statfsSync(dataDir);
    return Math.max(1, Math.min(64 * 1024, Math.floor((s.blocks * s.bsize) / 4 / 1024 / 1024)));
  } catch {
    return 16 * 1024;
  }
}

/**
 * A host that shares no disk with the cluster (a cloud host) gets its layer set from a
 * gateway before it reports ready: with lazy layers, each layer's metadata and its prefetch
 * list (the chunks first runs read), else whole layers into its own store. "cluster" names
 * the set the burst controller publishes.
 */
export function layerSyncOf(config: Config, redis: Redis, store: LayerStore, tmpDir: string, lazy: LazyLayers | undefined): (signal: AbortSignal) => Promise<string[]> {
  const { gatewayUrl, gatewayToken, syncLayers } = config.node;
  if (!gatewayUrl || !gatewayToken) throw new Error('ROLLBOX_SYNC_LAYERS needs ROLLBOX_GATEWAY_URL and ROLLBOX_GATEWAY_TOKEN (a token with scope layer:host: it reads every layer its host mounts)');
  const images = new ImageRegistry(redis, new LayerRegistry(redis));
  return async (signal) => {
    const digests = new Set<string>();
    for (const ref of syncLayers) {
      if (ref === 'cluster') {
        const published = await redis.smembers(keys.burstSyncedLayers);
        if (!published.length) throw new Error('the cluster has not published its pre-synced layer set yet (a gateway does at start)');
        for (const d of published) digests.add(d);
      } else for (const d of await images.layersOf(ref)) digests.add(d);
    }
    const sorted = [...digests].sort();
    // Lazy: "synced" is the metadata here and the prefetch list filled; single-image layers are copied whole.
    const whole: string[] = [];
    for (const digest of sorted) if (!lazy || (!(await store.has(digest)) && !(await lazy.presync(digest)))) whole.push(digest);
    await fetchLayers(whole, { gatewayUrl, token: gatewayToken, store, tmpDir, signal });
    return sorted;
  };
}

