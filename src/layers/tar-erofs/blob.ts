import { closeSync, ftruncateSync, openSync, writeSync } from 'node:fs';
import { ChunkHasher } from '../split.ts';
import { BLOCK_BYTES } from './bytes.ts';

const ZERO_BLOCK = Buffer.alloc(BLOCK_BYTES);

/**
 * A layer's data blob, written once, front to back: each file's contents start on a block
 * boundary (the EROFS chunk indexes address blocks), the gaps read as zeros. The chunk
 * digests of the chunk table are taken as the bytes go by, so the blob is never read back.
 */
export class BlobWriter {
  readonly chunks: ChunkHasher;
  private readonly fd: number;
  private offset = 0;
  private closed = false;

  constructor(path: string, chunkSizeBytes: number) {
    this.chunks = new ChunkHasher(chunkSizeBytes);
    this.fd = openSync(path, 'wx', 0o600);
  }

  /** Where the next file's contents start. */
  startFile(): number {
    this.padToBlock();
    return this.offset;
  }

  write(bytes: Buffer): void {
    let done = 0;
    while (done < bytes.length) done += writeSync(this.fd, bytes, done, bytes.length - done, this.offset + done);
    this.chunks.update(bytes);
    this.offset += bytes.length;
  }

  /** Pads the last block and closes the file; answers the blob's size. */
  finish(): number {
    this.padToBlock();
    ftruncateSync(this.fd, this.offset);
    this.closed = true;
    closeSync(this.fd);
    return this.offset;
  }

  /** Closes the file of a build that failed, if still open (the caller removes it). */
  abandon(): void {
    if (this.closed) return;
    this.closed = true;
    closeSync(this.fd);
  }

  private padToBlock(): void {
    const gap = (BLOCK_BYTES - (this.offset % BLOCK_BYTES)) % BLOCK_BYTES;
    if (gap === 0) return;
    this.chunks.update(ZERO_BLOCK.subarray(0, gap));
    this.offset += gap;
  }
}
