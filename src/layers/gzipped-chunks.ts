import { randomBytes } from 'node:crypto';
import { mkdir, open, readFile, rename, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { gzip } from 'node:zlib';
import { RollboxError, type LayerChunkTable } from '../api/index.ts';
import { chunkRange, parseChunkTable } from './split.ts';
import type { LayerStore } from './store.ts';

const gzipOnPool = promisify(gzip);
/** Chunk tables kept parsed (a layer's is read once per gateway, not once per range). */
const TABLES_KEPT = 256;

/**
 * The chunks of split layers' blobs gzipped, each made once, on its first request, and kept
 * in the store beside its layer (`<hex>.gz/<chunk index>`, removed with the layer): the
 * origin of hosts reading layers on demand serves the same chunks to every host, and
 * gzipping them per request cost it about a CPU second per 100 MB sent (bench:lazy). A run
 * of chunks goes as their gzip members one after another, which a gunzip reads as one
 * stream. Several gateways sharing the store may make the same chunk at once: each writes
 * its own file and renames it into place, so a reader sees one whole file or none.
 */
export class GzippedChunks {
  private readonly tables = new Map<string, LayerChunkTable>();
  private readonly making = new Map<string, Promise<Buffer>>();

  constructor(
    private readonly store: Pick<LayerStore, 'chunkTable' | 'splitPathsOf' | 'gzippedChunksDirOf'>,
    private readonly level: number,
  ) {}

  /**
   * Bytes [start, end] (inclusive) of a layer's file, gzipped, as gzip members one after
   * another, made as they are taken: the kept chunks when they are whole chunks of a split
   * layer's blob, else each piece of at most FILE_PIECE_BYTES gzipped now. A read holds
   * one piece at a time, whatever its range.
   */
  async *range(digest: string, filePath: string, start: number, end: number): AsyncGenerator<Buffer> {
    const table = filePath === this.store.splitPathsOf(digest).blobPath ? await this.tableOf(digest) : undefined;
    const first = table ? Math.floor(start / table.chunkSizeBytes) : 0;
    const last = table ? Math.floor(end / table.chunkSizeBytes) : 0;
    if (!table || chunkRange(table, first).start !== start || chunkRange(table, last).end !== end + 1) {
      for await (const piece of filePieces(filePath, start, end - start + 1)) yield await gzipOnPool(piece, { level: this.level });
      return;
    }
    for (let i = first; i <= last; i++) yield await this.chunk(digest, table, i);
  }

  private async tableOf(digest: string): Promise<LayerChunkTable | undefined> {
    const known = this.tables.get(digest);
    if (known) return known;
    const bytes = await this.store.chunkTable(digest);
    if (!bytes) return undefined;
    const table = parseChunkTable(bytes, digest);
    if (this.tables.size >= TABLES_KEPT) this.tables.delete(this.tables.keys().next().value!);
    this.tables.set(digest, table);
    return table;
  }

  private chunk(digest: string, table: LayerChunkTable, index: number): Promise<Buffer> {
    const file = path.join(this.store.gzippedChunksDirOf(digest), String(index));
    const making = this.making.get(file);
    if (making) return making;
    const made = readFile(file)
      .catch(async () => {
        const { start, end } = chunkRange(table, index);
        const gzipped = await gzipOnPool(await readBlob(this.store.splitPathsOf(digest).blobPath, start, end - start), { level: this.level });
        await mkdir(path.dirname(file), { recursive: true });
        const partial = `${file}.${process.pid}-${randomBytes(4).toString('hex')}`;
        await writeFile(partial, gzipped, { mode: 0o444 });
        await rename(partial, file);
        return gzipped;
      })
      .finally(() => this.making.delete(file));
    this.making.set(file, made);
    return made;
  }
}

/** The pieces a layer file is read and sent in: a chunk (a host's unit) at a time. */
export const FILE_PIECE_BYTES = 1 << 20;

/**
 * `length` bytes of a layer's file from `start`, in pieces of at most FILE_PIECE_BYTES,
 * each read when it is asked for (the file is closed when the reader stops).
 */
export async function* filePieces(filePath: string, start: number, length: number): AsyncGenerator<Buffer> {
  const file = await open(filePath, 'r');
  try {
    for (let at = 0; at < length; ) {
      const piece = Buffer.allocUnsafe(Math.min(FILE_PIECE_BYTES, length - at));
      for (let got = 0; got < piece.length; ) {
        const { bytesRead } = await file.read(piece, got, piece.length - got, start + at + got);
        if (bytesRead === 0) throw new RollboxError('not_found', 'the layer changed in the store meanwhile (shorter than its size)');
        got += bytesRead;
      }
      at += piece.length;
      yield piece;
    }
  } finally {
    await file.close();
  }
}

/** `length` bytes of a layer's file from `start`, in one buffer (one chunk to gzip and keep). */
async function readBlob(blobPath: string, start: number, length: number): Promise<Buffer> {
  const pieces: Buffer[] = [];
  for await (const piece of filePieces(blobPath, start, length)) pieces.push(piece);
  return pieces.length === 1 ? pieces[0]! : Buffer.concat(pieces);
}
