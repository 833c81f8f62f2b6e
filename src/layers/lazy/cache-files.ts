import { closeSync, existsSync, ftruncateSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { readdir, rename, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { chunkCountOf } from '../split.ts';
import type { CachedLayer, LayerPaths, LazyLayersLogger } from './types.ts';

/** The files of one layer in the chunk cache. */
export function layerPaths(cacheDir: string, hex: string): LayerPaths {
  const base = path.join(cacheDir, hex);
  return { tablePath: `${base}.chunks`, metaPath: `${base}.meta`, dataPath: `${base}.data`, mapPath: `${base}.map` };
}

/** The layer's map: one byte per chunk, 1 once the gate wrote and synced it. */
export function presenceOf(layer: CachedLayer): Buffer {
  return readQuiet(layer.mapPath) ?? Buffer.alloc(0);
}

/** Here already: in the map, or delivered to the gate, or on its way. */
export function isHere(layer: CachedLayer, map: Buffer, i: number): boolean {
  return map[i] === 1 || layer.delivered.has(i) || layer.fetching.has(i);
}

export function isComplete(layer: CachedLayer): boolean {
  const map = presenceOf(layer);
  return map.length === layer.table.chunks.length && !map.includes(0);
}

/** The sparse blob and its map, made if the cache has none (first use, or evicted). */
export function ensureData(layer: CachedLayer): void {
  const n = chunkCountOf(layer.table.blob.sizeBytes, layer.table.chunkSizeBytes);
  const ok = existsSync(layer.dataPath) && existsSync(layer.mapPath) && presenceOf(layer).length === n;
  if (ok) return;
  // Made fresh together: a map without its data (or data without its map) says nothing true.
  for (const p of [layer.mapPath, layer.dataPath]) rmSync(p, { force: true });
  const fd = openSync(layer.dataPath, 'wx', 0o600);
  try {
    ftruncateSync(fd, layer.table.blob.sizeBytes);
  } finally {
    closeSync(fd);
  }
  writeFileSync(layer.mapPath, Buffer.alloc(n), { mode: 0o600 });
}

/** Bytes the cache takes on disk now (allocated blocks: the blobs are sparse). */
export async function usedBytesOf(cacheDir: string): Promise<number> {
  let sum = 0;
  for (const name of await readdir(cacheDir).catch(() => [] as string[])) {
    sum += await stat(path.join(cacheDir, name)).then((s) => s.blocks * 512, () => 0);
  }
  return sum;
}

/** Past the limit: the data of the least recently used layers no mount needs goes (their metadata stays). */
export async function evictPastLimit(layers: Iterable<CachedLayer>, cacheDir: string, limitBytes: number, logger?: LazyLayersLogger): Promise<string[]> {
  let used = await usedBytesOf(cacheDir);
  const evicted: string[] = [];
  if (used <= limitBytes) return evicted;
  const candidates = [...layers].filter((l) => !l.attached && existsSync(l.dataPath)).sort((a, b) => a.lastUsedMs - b.lastUsedMs);
  for (const l of candidates) {
    if (used <= limitBytes) break;
    const freed = (await stat(l.dataPath).then((s) => s.blocks * 512, () => 0)) + (await stat(l.mapPath).then((s) => s.blocks * 512, () => 0));
    await rm(l.mapPath, { force: true });
    await rm(l.dataPath, { force: true });
    used -= freed;
    evicted.push(l.digest);
  }
  if (evicted.length) logger?.info({ layers: evicted, usedBytes: used, limitBytes }, 'lazy layers: evicted cached data');
  return evicted;
}

/** Layer ids (64 hex digits) that have any file in the cache. */
export async function cachedHexes(cacheDir: string): Promise<Set<string>> {
  const names = await readdir(cacheDir).catch(() => [] as string[]);
  return new Set(names.flatMap((n) => (/^[0-9a-f]{64}\./.test(n) ? [n.slice(0, 64)] : [])));
}

export async function removeLayerFiles(paths: LayerPaths): Promise<void> {
  for (const p of [paths.tablePath, paths.mapPath, paths.dataPath, paths.metaPath]) await rm(p, { force: true });
}

/** Leftovers of a metadata fetch a previous process did not finish. */
export async function removeTemporaries(cacheDir: string): Promise<void> {
  for (const n of await readdir(cacheDir)) if (n.includes('.tmp-')) await rm(path.join(cacheDir, n), { force: true });
}

export async function writeAtomically(to: string, bytes: Buffer): Promise<void> {
  const tmp = `${to}.tmp-${randomBytes(4).toString('hex')}`;
  await writeFile(tmp, bytes, { mode: 0o600 });
  await rename(tmp, to);
}

export function readQuiet(p: string): Buffer | undefined {
  try {
    return readFileSync(p);
  } catch {
    return undefined;
  }
}

/** What the mounted lazy layers may still grow to (each to its whole blob: every chunk could be read), plus every layer's metadata. */
export function committedBytesOf(layers: Iterable<CachedLayer>): number {
  let sum = 0;
  for (const l of layers) sum += l.table.meta.sizeBytes + (l.attached ? l.table.blob.sizeBytes : 0);
  return sum;
}

/** Bytes the cache would have to take for these layers (those not mounted here yet). */
export async function demandBytesOf(layers: ReadonlyMap<string, CachedLayer>, digests: readonly string[], sizeOf?: (digest: string) => Promise<number | undefined>): Promise<number> {
  let sum = 0;
  for (const digest of new Set(digests)) {
    const known = layers.get(digest);
    if (known) sum += known.attached ? 0 : known.table.blob.sizeBytes;
    else sum += (await sizeOf?.(digest)) ?? 0;
  }
  return sum;
}
