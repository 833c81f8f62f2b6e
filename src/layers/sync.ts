import { createHash, randomBytes } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { mkdir, rm } from 'node:fs/promises';
import path from 'node:path';
import { Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ReadableStream as WebReadableStream } from 'node:stream/web';
import { createGunzip } from 'node:zlib';
import { RollboxError, type LayerChunkTable } from '../api/index.ts';
import { hexOfDigest, tap } from './digest.ts';
import { parseChunkTable } from './split.ts';
import type { LayerStore } from './store.ts';

export interface LayerFetchOptions {
  /** Gateway base URL; files come from `GET /v1/layers/:digest/{chunks,meta,blob}`. */
  gatewayUrl: string;
  /** Bearer token with layer read scope. */
  token: string;
  store: Pick<LayerStore, 'has' | 'put' | 'putSplit'>;
  tmpDir: string;
  fetchImpl?: typeof fetch;
  signal?: AbortSignal;
  /** Told the bytes of every response body read (what the host fetched). */
  onBytes?: (bytes: number) => void;
}

/**
 * Copies whole layers from a gateway into this host's own store (a host that shares no disk
 * with the cluster, with ROLLBOX_LAYER_FETCH=full or a cloud host's sync of single-image
 * layers). Every byte is checked before the layer is stored: a split layer's chunk table
 * against its digest, then its meta and every blob chunk against the table; a single-image
 * layer against its digest. Layers already in the store are skipped. Returns the digests now
 * held.
 */
export async function fetchLayers(digests: readonly string[], options: LayerFetchOptions): Promise<string[]> {
  await mkdir(options.tmpDir, { recursive: true });
  for (const digest of digests) {
    if (await options.store.has(digest)) continue;
    await fetchOne(digest, options);
  }
  return [...digests];
}

/** How a layer file GET is bounded: each attempt (`attemptTimeoutMs`, its body included), and how long a busy gateway is waited for. */
export interface LayerGetBounds {
  /** One attempt's deadline, its body's reading included (besides `signal`). */
  attemptTimeoutMs?: number;
  /** How long 503 answers (a gateway at its cap on layer reads, or starting) are retried after their Retry-After (default 120 s). */
  busyRetryMs?: number;
}

const DEFAULT_BUSY_RETRY_MS = 120_000;
const MAX_BUSY_WAIT_MS = 5_000;
/**
 * A GET whose connection failed before any answer is sent again this many times: a kept-alive
 * connection the gateway closed as it was reused (its keep-alive timeout) fails a request
 * that never reached it, and many reads at once on a loaded host meet that race.
 */
const CONNECTION_RETRIES = 2;
const CONNECTION_RETRY_WAIT_MS = 100;

/**
 * GET of one of a layer's files: the response (404 as undefined when `missingOk`). A 503 (the
 * gateway serves as many layer reads as it allows) is asked again after its Retry-After,
 * jittered, for up to `busyRetryMs`: a cap on the origin slows a host's reads, it does not
 * fail them.
 */
export async function getLayerFile(digest: string, file: 'chunks' | 'meta' | 'blob', options: Pick<LayerFetchOptions, 'gatewayUrl' | 'token' | 'fetchImpl' | 'signal'> & LayerGetBounds, init: { range?: string; missingOk?: boolean } = {}): Promise<Response | undefined> {
  const url = `${options.gatewayUrl.replace(/\/$/, '')}/v1/layers/${digest}/${file}`;
  const headers: Record<string, string> = { authorization: `Bearer ${options.token}` };
  // A range of a blob may come gzipped (the gateway's ROLLBOX_LAYER_BLOB_GZIP_LEVEL): see decodedBody.
  if (init.range) Object.assign(headers, { range: init.range, [CHUNK_ENCODING_HEADER]: 'gzip' });
  const busyUntil = Date.now() + (options.busyRetryMs ?? DEFAULT_BUSY_RETRY_MS);
  let connectionFailures = 0;
  for (let busy = 0; ; busy++) {
    const bounds = [options.signal, options.attemptTimeoutMs === undefined ? undefined : AbortSignal.timeout(options.attemptTimeoutMs)].filter((s) => s !== undefined);
    let response: Response;
    try {
      response = await (options.fetchImpl ?? fetch)(url, { headers, signal: bounds.length > 1 ? AbortSignal.any(bounds) : bounds[0] });
    } catch (err) {
      // A deadline or the caller's abort ends it; a connection that failed is tried again (a GET: nothing happened twice).
      const aborted = options.signal?.aborted || (err instanceof Error && (err.name === 'TimeoutError' || err.name === 'AbortError'));
      if (!aborted && connectionFailures++ < CONNECTION_RETRIES) {
        busy--;
        await sleep(CONNECTION_RETRY_WAIT_MS);
        continue;
      }
      const cause = err instanceof Error && err.cause instanceof Error ? ` (${err.cause.message})` : '';
      throw new RollboxError('unavailable', `layer ${digest}: GET ${url} failed: ${err instanceof Error ? err.message : String(err)}${cause}`);
    }
    if (response.status === 503) {
      await response.body?.cancel().catch(() => undefined);
      const retryAfterMs = Math.min(MAX_BUSY_WAIT_MS, Math.max(100, Number(response.headers.get('retry-after') ?? 1) * 1000 || 1000));
      const waitMs = retryAfterMs * (0.5 + Math.random());
      if (Date.now() + waitMs > busyUntil || options.signal?.aborted) throw new RollboxError('unavailable', `layer ${digest}: GET ${url} answered 503 (busy) ${busy + 1} times`);
      await sleep(waitMs);
      continue;
    }
    if (response.status === 404 && init.missingOk) {
      await response.body?.cancel().catch(() => undefined);
      return undefined;
    }
    if (!response.ok || !response.body) {
      // Not read: an origin's error body may be anything, of any size.
      await response.body?.cancel().catch(() => undefined);
      throw new RollboxError('unavailable', `layer ${digest}: GET ${url} answered ${response.status}`);
    }
    return response;
  }
}

/** A chunk table holds 65 bytes a chunk: this is half a million chunks (512 GiB of 1 MiB chunks). */
export const CHUNK_TABLE_MAX_BYTES = 32 * 1024 * 1024;

/** A layer file's body whole, refused past `maxBytes` without reading on (an origin answering more than the file can be). */
export async function readCapped(response: Response, maxBytes: number, what: string, options: Pick<LayerFetchOptions, 'onBytes'>): Promise<Buffer> {
  const pieces: Buffer[] = [];
  let size = 0;
  for await (const piece of response.body as WebReadableStream<Uint8Array>) {
    size += piece.length;
    options.onBytes?.(piece.length);
    if (size > maxBytes) {
      await response.body?.cancel().catch(() => undefined);
      throw new RollboxError('invalid_layer', `${what}: the origin answered more than ${maxBytes} bytes`);
    }
    pieces.push(Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength));
  }
  return Buffer.concat(pieces);
}

/**
 * The request and answer header of a gzipped range of a layer's blob (the gateway's
 * serveFile says why it is not Content-Encoding).
 */
export const CHUNK_ENCODING_HEADER = 'x-rollbox-chunk-encoding';

/** A layer file's body as stored: a gzipped range decoded here, where a corrupted stream fails the read. */
export function decodedBody(response: Response): AsyncIterable<Uint8Array> {
  const body = response.body as WebReadableStream<Uint8Array>;
  if (response.headers.get(CHUNK_ENCODING_HEADER) !== 'gzip') return body;
  // 256 KiB pieces: at zlib's 16 KiB default, inflating costs 3x (one callback per piece; decompress.ts).
  const gunzip = createGunzip({ chunkSize: 256 * 1024 });
  pipeline(Readable.fromWeb(body), gunzip).catch(() => {}); // an error reaches the reader through gunzip
  return gunzip;
}

async function fetchOne(digest: string, options: LayerFetchOptions): Promise<void> {
  const tmpBase = path.join(options.tmpDir, `fetch-${hexOfDigest(digest).slice(0, 12)}-${randomBytes(4).toString('hex')}`);
  try {
    const tableResponse = await getLayerFile(digest, 'chunks', options, { missingOk: true });
    if (!tableResponse) {
      // A single-image layer: the blob is the image, and its sha256 the digest.
      const hash = createHash('sha256');
      await download(await getLayerFile(digest, 'blob', options), `${tmpBase}.erofs`, tap((c) => hash.update(c)), options);
      const actual = `sha256:${hash.digest('hex')}`;
      if (actual !== digest) throw new RollboxError('invalid_layer', `layer ${digest}: downloaded bytes hash to ${actual}`);
      await options.store.put(`${tmpBase}.erofs`);
      return;
    }
    const tableBytes = await readCapped(tableResponse, CHUNK_TABLE_MAX_BYTES, `layer ${digest}: its chunk table`, options);
    const table = parseChunkTable(tableBytes, digest);
    const metaHash = createHash('sha256');
    let metaBytes = 0;
    const metaCheck = tap((c) => {
      if ((metaBytes += c.length) > table.meta.sizeBytes) throw new RollboxError('invalid_layer', `layer ${digest}: its metadata image is longer than its chunk table says`);
      metaHash.update(c);
    });
    await download(await getLayerFile(digest, 'meta', options), `${tmpBase}.meta`, metaCheck, options);
    if (metaHash.digest('hex') !== table.meta.sha256) throw new RollboxError('invalid_layer', `layer ${digest}: its metadata image does not match its chunk table`);
    await download(await getLayerFile(digest, 'blob', options), `${tmpBase}.blob`, chunkChecker(digest, table), options);
    await options.store.putSplit({ metaPath: `${tmpBase}.meta`, blobPath: `${tmpBase}.blob`, chunkSizeBytes: table.chunkSizeBytes, table: tableBytes });
  } finally {
    await Promise.all(['.erofs', '.meta', '.blob'].map((ext) => rm(`${tmpBase}${ext}`, { force: true })));
  }
}

async function download(response: Response | undefined, to: string, check: Transform, options: Pick<LayerFetchOptions, 'onBytes'>): Promise<void> {
  await pipeline(
    Readable.fromWeb(response!.body as never),
    tap((c) => options.onBytes?.(c.length)),
    check,
    createWriteStream(to),
  );
}

/** A stream stage that checks each chunk of a blob against the table as it passes (and the blob's length at its end). */
function chunkChecker(digest: string, table: LayerChunkTable): Transform {
  let index = 0;
  let inChunk = 0;
  let hash = createHash('sha256');
  let total = 0;
  const finishChunk = (): void => {
    const got = hash.digest('hex');
    if (got !== table.chunks[index]) throw new RollboxError('invalid_layer', `layer ${digest}: chunk ${index} of its blob does not match its chunk table`);
    index++;
    inChunk = 0;
    hash = createHash('sha256');
  };
  return new Transform({
    transform(piece: Buffer, _encoding, done) {
      try {
        total += piece.length;
        if (total > table.blob.sizeBytes) throw new RollboxError('invalid_layer', `layer ${digest}: its blob is longer than its chunk table says`);
        let buf = piece;
        while (buf.length > 0) {
          const take = Math.min(buf.length, table.chunkSizeBytes - inChunk);
          hash.update(buf.subarray(0, take));
          inChunk += take;
          buf = buf.subarray(take);
          if (inChunk === table.chunkSizeBytes) finishChunk();
        }
        done(null, piece);
      } catch (err) {
        done(err as Error);
      }
    },
    flush(done) {
      try {
        if (inChunk > 0) finishChunk();
        if (total !== table.blob.sizeBytes) throw new RollboxError('invalid_layer', `layer ${digest}: its blob is ${total} bytes, its chunk table says ${table.blob.sizeBytes}`);
        done();
      } catch (err) {
        done(err as Error);
      }
    },
  });
}
