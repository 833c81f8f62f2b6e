import { createHash, randomBytes } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { mkdir, rm } from 'node:fs/promises';
import path from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { RollboxError } from '../api/index.ts';
import { hexOfDigest, tap } from './digest.ts';
import type { LayerStore } from './store.ts';

export interface LayerFetchOptions {
  /** Gateway base URL; blobs come from `GET /v1/layers/:digest/blob`. */
  gatewayUrl: string;
  /** Bearer token with layer read scope. */
  token: string;
  store: LayerStore;
  tmpDir: string;
  fetchImpl?: typeof fetch;
  signal?: AbortSignal;
}

/**
 * Copies layer images from a gateway into this host's own store (a cloud host shares no
 * disk with the cluster). Every blob is checked against its sha256 digest before it is
 * stored, so a wrong or truncated download never becomes a layer. Layers already in the
 * store are skipped. Returns the digests now held.
 */
export async function fetchLayers(digests: readonly string[], options: LayerFetchOptions): Promise<string[]> {
  await mkdir(options.tmpDir, { recursive: true });
  for (const digest of digests) {
    if (await options.store.has(digest)) continue;
    await fetchOne(digest, options);
  }
  return [...digests];
}

async function fetchOne(digest: string, options: LayerFetchOptions): Promise<void> {
  const expectedHex = hexOfDigest(digest);
  const url = `${options.gatewayUrl.replace(/\/$/, '')}/v1/layers/${digest}/blob`;
  const response = await (options.fetchImpl ?? fetch)(url, { headers: { authorization: `Bearer ${options.token}` }, signal: options.signal });
  if (!response.ok || !response.body) {
    const text = await response.text().catch(() => '');
    throw new RollboxError('unavailable', `layer ${digest}: GET ${url} answered ${response.status} ${text.slice(0, 200)}`);
  }
  const tmpPath = path.join(options.tmpDir, `fetch-${expectedHex.slice(0, 12)}-${randomBytes(4).toString('hex')}.erofs`);
  const hash = createHash('sha256');
  try {
    await pipeline(Readable.fromWeb(response.body as never), tap((c) => hash.update(c)), createWriteStream(tmpPath));
    const actualHex = hash.digest('hex');
    if (actualHex !== expectedHex) throw new RollboxError('invalid_layer', `layer ${digest}: downloaded bytes hash to sha256:${actualHex}`);
    await options.store.put(tmpPath);
  } finally {
    await rm(tmpPath, { force: true });
  }
}
