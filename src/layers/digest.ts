import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { Transform } from 'node:stream';
import { RollboxError } from '../api/index.ts';

const DIGEST_RE = /^sha256:([0-9a-f]{64})$/;

/** The 64 hex digits of a `sha256:<hex>` digest; throws on anything else (digests become paths). */
export function hexOfDigest(digest: string): string {
  const m = DIGEST_RE.exec(digest);
  if (!m) throw new RollboxError('invalid_request', `not a layer digest: ${JSON.stringify(digest).slice(0, 100)}`);
  return m[1]!;
}

export function isLayerDigest(value: string): boolean {
  return DIGEST_RE.test(value);
}

export async function sha256File(filePath: string): Promise<{ hex: string; sizeBytes: number }> {
  const hash = createHash('sha256');
  let sizeBytes = 0;
  for await (const chunk of createReadStream(filePath, { highWaterMark: 1 << 20 })) {
    hash.update(chunk as Buffer);
    sizeBytes += (chunk as Buffer).length;
  }
  return { hex: hash.digest('hex'), sizeBytes };
}

/** A pass-through stream stage that shows every chunk to `onChunk` (a hash, a byte count). */
export function tap(onChunk: (chunk: Buffer) => void): Transform {
  return new Transform({
    transform(chunk: Buffer, _encoding, done) {
      try {
        onChunk(chunk);
      } catch (err) {
        return done(err as Error); // fails the pipeline (a throw here would escape it)
      }
      done(null, chunk);
    },
  });
}
