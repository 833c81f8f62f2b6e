import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { decompressed } from './decompress.ts';

/** What the stages give for `input`: the bytes, or the error that ended them. */
async function decode(input: Buffer): Promise<Buffer> {
  const stages = await decompressed(Readable.from([input]));
  const out: Buffer[] = [];
  await pipeline(...(stages as [Readable]), async (source: AsyncIterable<Buffer>) => {
    for await (const c of source) out.push(c);
  });
  return Buffer.concat(out);
}

describe('decompressed', () => {
  const data = randomBytes(300_000);
  const zstd = execFileSync('zstd', ['-q', '-c'], { input: data });

  it('decodes gzip, zstd and plain input', async () => {
    expect((await decode(gzipSync(data))).equals(data)).toBe(true);
    expect((await decode(zstd)).equals(data)).toBe(true);
    expect((await decode(data)).equals(data)).toBe(true);
  });

  it('fails a garbage or cut zstd frame (ZSTD_FAILED) instead of ending early', async () => {
    const garbage = Buffer.concat([zstd.subarray(0, 4), randomBytes(5000)]);
    await expect(decode(garbage)).rejects.toMatchObject({ code: 'ZSTD_FAILED' });
    await expect(decode(zstd.subarray(0, Math.floor(zstd.length / 2)))).rejects.toMatchObject({ code: 'ZSTD_FAILED' });
    await expect(decode(zstd.subarray(0, 8))).rejects.toMatchObject({ code: 'ZSTD_FAILED' });
  });

  it('fails a garbage or cut gzip stream', async () => {
    const gz = gzipSync(data);
    await expect(decode(Buffer.concat([gz.subarray(0, 10), randomBytes(5000)]))).rejects.toMatchObject({ code: 'Z_DATA_ERROR' });
    await expect(decode(gz.subarray(0, Math.floor(gz.length / 2)))).rejects.toMatchObject({ code: 'Z_BUF_ERROR' });
  });
});
