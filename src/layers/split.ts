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
  const chunks = new ChunkHasher(chunkSizeBytes);
  for await (const piece of createReadStream(blobPath, { highWaterMark: chunkSizeBytes })) chunks.update(piece as Buffer);
  return chunkTableBytes({ sha256: meta.hex, sizeBytes: meta.sizeBytes }, chunks);
}

/** A chunk table's bytes: the layer's digest is their sha256. */
export function chunkTableBytes(meta: LayerChunkTable['meta'], blob: ChunkHasher): Buffer {
  const table: LayerChunkTable = { format: CHUNK_TABLE_FORMAT, chunkSizeBytes: blob.chunkSizeBytes, meta, blob: { sizeBytes: blob.sizeBytes }, chunks: blob.digests() };
  return Buffer.from(`${JSON.stringify(table)}\n`);
}

/** The sha256 of each chunk of a blob whose bytes pass through `update` in order. */
export class ChunkHasher {
  sizeBytes = 0;
  private readonly chunks: string[] = [];
  private hash = createHash('sha256');
  private inChunk = 0;

  constructor(readonly chunkSizeBytes: number) {}

  update(bytes: Buffer): void {
    let buf = bytes;
    this.sizeBytes += buf.length;
    while (buf.length > 0) {
      const take = Math.min(buf.length, this.chunkSizeBytes - this.inChunk);
      this.hash.update(buf.subarray(0, take));
      this.inChunk += take;
      buf = buf.subarray(take);
      if (this.inChunk === this.chunkSizeBytes) {
        this.chunks.push(this.hash.digest('hex'));
        this.hash = createHash('sha256');
        this.inChunk = 0;
      }
    }
  }

  /** Every chunk's digest, the last one partial (call once, after the last update). */
  digests(): string[] {
    if (this.inChunk > 0) {
      this.chunks.push(this.hash.digest('hex'));
      this.inChunk = 0;
    }
    return this.chunks;
  }
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
