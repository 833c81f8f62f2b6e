import { spawn } from 'node:child_process';
import { Duplex, PassThrough, Readable } from 'node:stream';
import { createGunzip } from 'node:zlib';

const GZIP_MAGIC = [0x1f, 0x8b];
const ZSTD_MAGIC = [0x28, 0xb5, 0x2f, 0xfd];
/** zlib's output piece: at its 16 KiB default, inflating a layer took 3x as long (one callback per piece). */
const GUNZIP_CHUNK_BYTES = 256 * 1024;

export type Compression = 'gzip' | 'zstd';

/**
 * The decompression tool for each compression, reading stdin and writing stdout (a layer
 * thread reads its output: extract-workers.ts). `gzip` exits 2 on a mere warning (trailing
 * zeros after the data), which is not a failure.
 */
export const DECOMPRESSOR_ARGV: Record<Compression, readonly string[]> = { gzip: ['gzip', '-dc'], zstd: ['zstd', '-dcq'] };

/** The stream's compression, by its magic (undefined: a plain tar), and the stream to read from now on (its first bytes put back). */
export async function sniffCompression(input: Readable): Promise<{ compression: Compression | undefined; stream: Readable }> {
  const it = input[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  let head = Buffer.alloc(0);
  let ended = false;
  while (head.length < ZSTD_MAGIC.length) {
    const n = await it.next();
    if (n.done) {
      ended = true;
      break;
    }
    head = Buffer.concat([head, asBuffer(n.value)]);
  }
  async function* replay(): AsyncGenerator<Buffer> {
    if (head.length) yield head;
    if (ended) return;
    for (;;) {
      const n = await it.next();
      if (n.done) return;
      yield asBuffer(n.value);
    }
  }
  const stream = Readable.from(replay(), { objectMode: false });
  const startsWith = (magic: number[]): boolean => magic.every((b, i) => head[i] === b);
  return { compression: startsWith(GZIP_MAGIC) ? 'gzip' : startsWith(ZSTD_MAGIC) ? 'zstd' : undefined, stream };
}

/**
 * The stream as pipeline stages, with a decompression stage when it starts with the gzip
 * or zstd magic (image layers come either way; Node 20 has no zstd, so the `zstd` tool
 * decompresses). Plain tars pass as they are.
 */
export async function decompressed(input: Readable): Promise<[Readable] | [Readable, Duplex]> {
  const { compression, stream } = await sniffCompression(input);
  if (compression === 'gzip') return [stream, createGunzip({ chunkSize: GUNZIP_CHUNK_BYTES })];
  if (compression === 'zstd') return [stream, zstdDecompressor()];
  return [stream];
}

/** A view, not a copy (Buffer.from(buffer) would copy every chunk of a multi-GB stream). */
function asBuffer(chunk: Uint8Array): Buffer {
  return Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
}

/**
 * The `zstd` tool as a stage. Its output ends only once zstd has exited 0: a garbage or cut
 * frame makes zstd print what it could and exit non-zero after closing its output, and that
 * output must fail (`ZSTD_FAILED`) rather than end as a short (or empty) tar.
 */
function zstdDecompressor(): Duplex {
  const child = spawn('zstd', ['-dcq'], { stdio: ['pipe', 'pipe', 'pipe'] });
  const stderr: Buffer[] = [];
  child.stderr.on('data', (b: Buffer) => stderr.push(b));
  const output = new PassThrough();
  child.stdout.pipe(output, { end: false });
  const duplex = Duplex.from({ writable: child.stdin, readable: output });
  let tornDown = false;
  child.on('error', (err) => duplex.destroy(err));
  child.on('close', (code, signal) => {
    if (code === 0) return void output.end();
    if (tornDown) return;
    const why = Buffer.concat(stderr).toString().trim().slice(0, 300) || `zstd exited ${code ?? signal}`;
    duplex.destroy(Object.assign(new Error(why), { code: 'ZSTD_FAILED' }));
  });
  // A pipeline torn down early (a refused entry) must not leave zstd running.
  duplex.on('close', () => {
    tornDown = true;
    child.kill('SIGKILL');
  });
  return duplex;
}
