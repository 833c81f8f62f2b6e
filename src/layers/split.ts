import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { CHUNK_TABLE_FORMAT, LayerChunkTable, RollboxError } from '../api/index.ts';
import { sha256File } from './digest.ts';

/**
 * The chunk size of split layers: the unit a host without the layer fetches, caches and
 * checks. Chosen by measurement: see docs/images.md ("Choosing the chunk size").
 */
export const LAYER_CHUNK_BYTES = 1 << 20;

/** How many chunks a blob of `blobBytes` has. */
export function chunkCountOf(blobBytes: number, chunkSizeBytes: number): number {
  return Math.ceil(blobBytes / chunkSizeBytes);
}

/**
 * The chunk table (a split layer's identity document) of a built meta image and blob, as
 * the bytes that are stored and served: the layer's digest is their sha256.
 */
export async function chunkTableOf(metaPath: string, blobPath: string, chunkSizeBytes: number): Promise<Buffer> {
  const meta = await sha256File(metaPath);
  const chunks: string[] = [];
  let blobBytes = 0;
  let hash = createHash('sha256');
  let inChunk = 0;
  for await (const piece of createReadStream(blobPath, { highWaterMark: chunkSizeBytes })) {
    let buf = piece as Buffer;
    blobBytes += buf.length;
    while (buf.length > 0) {
      const take = Math.min(buf.length, chunkSizeBytes - inChunk);
      hash.update(buf.subarray(0, take));
      inChunk += take;
      buf = buf.subarray(take);
      if (inChunk === chunkSizeBytes) {
        chunks.push(hash.digest('hex'));
        hash = createHash('sha256');
        inChunk = 0;
      }
    }
  }
  if (inChunk > 0) chunks.push(hash.digest('hex'));
  const table: LayerChunkTable = { format: CHUNK_TABLE_FORMAT, chunkSizeBytes, meta: { sha256: meta.hex, sizeBytes: meta.sizeBytes }, blob: { sizeBytes: blobBytes }, chunks };
  return Buffer.from(`${JSON.stringify(table)}\n`);
}

/**
 * A chunk table received or read back: its bytes must hash to `digest` (when given), and
 * it must be well formed. Anything else is `invalid_layer`.
 */
export function parseChunkTable(bytes: Buffer, digest?: string): LayerChunkTable {
  if (digest) {
    const got = `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
    if (got !== digest) throw new RollboxError('invalid_layer', `chunk table of ${digest}: its bytes hash to ${got}`);
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(bytes.toString('utf8'));
  } catch {
    throw new RollboxError('invalid_layer', `chunk table${digest ? ` of ${digest}` : ''} is not JSON`);
  }
  const table = LayerChunkTable.safeParse(parsed);
  if (!table.success) throw new RollboxError('invalid_layer', `chunk table${digest ? ` of ${digest}` : ''}: ${table.error.issues[0]?.message ?? 'malformed'}`);
  if (table.data.chunks.length !== chunkCountOf(table.data.blob.sizeBytes, table.data.chunkSizeBytes)) {
    throw new RollboxError('invalid_layer', `chunk table${digest ? ` of ${digest}` : ''}: ${table.data.chunks.length} chunks for a blob of ${table.data.blob.sizeBytes} bytes`);
  }
  return table.data;
}

/** Byte range [start, end) of chunk `index`. */
export function chunkRange(table: Pick<LayerChunkTable, 'chunkSizeBytes' | 'blob'>, index: number): { start: number; end: number } {
  const start = index * table.chunkSizeBytes;
  return { start, end: Math.min(start + table.chunkSizeBytes, table.blob.sizeBytes) };
}
