import { Transform, type Duplex, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import tar from 'tar-stream';
import { RollboxError } from '../api/index.ts';
import { decompressed } from './decompress.ts';

export interface ExtractLimits {
  /** Cap on the sum of regular-file contents. */
  maxBytes: number;
  /** Cap on the number of tar entries. */
  maxEntries: number;
}

/** Tar metadata (headers, padding, pax records) allowed beyond file contents. */
const META_SLACK_BYTES = 16 * 1024 * 1024;
const META_BYTES_PER_ENTRY = 2048;

/**
 * The limits both tar readers (this one and tar-push.ts) enforce, as errors: tar metadata
 * beyond the contents read so far, entries, content bytes.
 */
export const tarLimits = {
  checkMetadata(rawBytes: number, contentBytes: number, entries: number): void {
    if (rawBytes - contentBytes > META_SLACK_BYTES + META_BYTES_PER_ENTRY * (entries + 1) + 2 * 1024 * 1024) throw new RollboxError('invalid_layer', 'tar metadata exceeds the allowed size');
  },
  checkEntries(limits: ExtractLimits, entries: number): void {
    if (entries > limits.maxEntries) throw new RollboxError('payload_too_large', `layer has more than ${limits.maxEntries} entries`);
  },
  checkContents(limits: ExtractLimits, contentBytes: number): void {
    if (contentBytes > limits.maxBytes) throw new RollboxError('payload_too_large', `layer contents exceed ${limits.maxBytes} bytes`);
  },
};

/** What a tar reader hands each entry: its header and a metered way to take its contents. */
export interface TarEntryVisit {
  header: tar.Header;
  /** The entry's contents, chunk by chunk, counted against `maxBytes`; refuses a truncated entry. */
  contents(): AsyncIterable<Buffer>;
  /** Skips the entry's contents (every entry must be taken or skipped). */
  skip(): void;
}

/**
 * Reads a tar (plain, gzip or zstd) entry by entry, enforcing the limits every layer
 * reader shares: entry count, content bytes, and tar metadata beyond the contents (which
 * caps tar-stream's buffering of pax and GNU long-name records, which never reach us as
 * entries, and gzip bombs). `onTarChunk` sees the decompressed tar (its sha256 is the
 * image's diff_id). Errors come out as RollboxErrors (`invalid_layer`, `payload_too_large`).
 */
export async function readTarEntries(input: Readable, limits: ExtractLimits, onTarChunk: ((chunk: Buffer) => void) | undefined, visit: (entry: TarEntryVisit) => Promise<void>): Promise<void> {
  const extract = tar.extract();
  let rawBytes = 0;
  let contentBytes = 0;
  let entries = 0;
  let failure: Error | undefined;
  const meter = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      rawBytes += chunk.length;
      onTarChunk?.(chunk);
      try {
        tarLimits.checkMetadata(rawBytes, contentBytes, entries);
      } catch (err) {
        cb(err as Error);
        return;
      }
      cb(null, chunk);
    },
  });

  let source: [Readable] | [Readable, Duplex];
  try {
    source = await decompressed(input);
  } catch (err) {
    throw toLayerError(err);
  }
  const stages = source.length === 2 ? pipeline(source[0], source[1], meter, extract) : pipeline(source[0], meter, extract);
  const piping = stages.catch((err: Error) => {
    failure ??= err;
  });

  try {
    for await (const entry of extract) {
      if (failure) throw failure;
      entries++;
      tarLimits.checkEntries(limits, entries);
      const header = entry.header;
      await visit({
        header,
        skip: () => entry.resume(),
        contents: async function* () {
          const size = header.size ?? 0;
          tarLimits.checkContents(limits, contentBytes + size);
          let taken = 0;
          for await (const chunk of entry as AsyncIterable<Buffer>) {
            taken += chunk.length;
            contentBytes += chunk.length;
            tarLimits.checkContents(limits, contentBytes);
            yield chunk;
          }
          if (taken !== size) throw new RollboxError('invalid_layer', `entry ${JSON.stringify(header.name)} is truncated`);
        },
      });
    }
    await piping;
    if (failure) throw failure;
  } catch (err) {
    extract.destroy();
    input.destroy();
    await piping;
    throw toLayerError(failure && !(err instanceof RollboxError) ? failure : err);
  }
}

export function toLayerError(err: unknown): Error {
  if (err instanceof RollboxError) return err;
  const e = err as NodeJS.ErrnoException;
  if (e?.code === 'ENAMETOOLONG') return new RollboxError('invalid_layer', 'entry path too long');
  if (e?.code === 'Z_DATA_ERROR' || e?.code === 'Z_BUF_ERROR') return new RollboxError('invalid_layer', `bad gzip data: ${e.message}`);
  if (e?.code === 'ZSTD_FAILED') return new RollboxError('invalid_layer', `bad zstd data: ${e.message}`);
  if (e instanceof Error && /tar|header|unexpected end/i.test(e.message)) return new RollboxError('invalid_layer', `malformed tar: ${e.message}`);
  return new RollboxError('internal', `layer extraction failed: ${e instanceof Error ? e.message : String(err)}`);
}
