import { existsSync } from 'node:fs';
import { stat } from 'node:fs/promises';
import { createHash } from 'node:crypto';
import { RollboxError, type LayerChunkTable } from '../../api/index.ts';
import { hexOfDigest } from '../digest.ts';
import { parseChunkTable } from '../split.ts';
import { CHUNK_TABLE_MAX_BYTES, getLayerFile, readCapped } from '../sync.ts';
import { layerPaths, readQuiet, writeAtomically } from './cache-files.ts';
import type { OriginOptions } from './fetcher.ts';
import type { CachedLayer } from './types.ts';

/**
 * A layer with its metadata in the cache: read back, or fetched from the origin now (chunk
 * table and metadata image, the image checked against the table). Undefined: a single-image
 * layer, which has no chunk table. Each request has the origin's deadline and each answer
 * its cap (the table's, the size the table gives the image): a slow or endless origin fails
 * the mount instead of holding it or the host's memory.
 */
export async function loadLayerMetadata(digest: string, cacheDir: string, origin: OriginOptions): Promise<CachedLayer | undefined> {
  const hex = hexOfDigest(digest);
  const paths = layerPaths(cacheDir, hex);
  let tableBytes = existsSync(paths.metaPath) ? readQuiet(paths.tablePath) : undefined;
  let table: LayerChunkTable;
  if (tableBytes) {
    table = parseChunkTable(tableBytes, digest);
  } else {
    const response = await getLayerFile(digest, 'chunks', { ...origin, attemptTimeoutMs: origin.timeoutMs }, { missingOk: true });
    if (!response) return undefined;
    tableBytes = await readCapped(response, CHUNK_TABLE_MAX_BYTES, `layer ${digest}: its chunk table`, origin);
    table = parseChunkTable(tableBytes, digest);
    const metaResponse = await getLayerFile(digest, 'meta', { ...origin, attemptTimeoutMs: origin.timeoutMs });
    const meta = await readCapped(metaResponse!, table.meta.sizeBytes, `layer ${digest}: its metadata image`, origin);
    if (createHash('sha256').update(meta).digest('hex') !== table.meta.sha256) throw new RollboxError('invalid_layer', `layer ${digest}: its metadata image from the origin does not match its chunk table`);
    // The table last: a layer is in the cache once its table is.
    await writeAtomically(paths.metaPath, meta);
    await writeAtomically(paths.tablePath, tableBytes);
  }
  const mtime = await stat(paths.tablePath).then((s) => s.mtimeMs, () => Date.now());
  return { digest, hex, table, ...paths, attached: false, lastUsedMs: mtime, fetching: new Set(), delivered: new Set() };
}
