import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, linkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import tar from 'tar-stream';
import { afterAll, describe, expect, it } from 'vitest';
import { readTarEntries } from './tar-entries.ts';
import { TarPushReader } from './tar-push.ts';

const LIMITS = { maxBytes: 1 << 30, maxEntries: 100_000 };
type Seen = { header: Record<string, unknown>; contents: string } | { error: string };

/** What tar-stream (readTarEntries) reads: every header and its contents, or the error it ends with. */
async function viaTarStream(bytes: Buffer, limits = LIMITS): Promise<Seen[]> {
  const seen: Seen[] = [];
  try {
    await readTarEntries(Readable.from([bytes]), limits, undefined, async (entry) => {
      const parts: Buffer[] = [];
      if (entry.header.type === 'file') for await (const c of entry.contents()) parts.push(c);
      else entry.skip();
      // Where the header sat in the tar: nothing reads it.
      const { byteOffset: _, ...header } = entry.header as tar.Header & { byteOffset?: number };
      seen.push({ header, contents: Buffer.concat(parts).toString('latin1') });
    });
  } catch (err) {
    seen.push({ error: (err as Error).message });
  }
  return seen;
}

/** The same through TarPushReader, the tar pushed in pieces of `piece` bytes. */
function viaPush(bytes: Buffer, piece: number, limits = LIMITS): Seen[] {
  const seen: Seen[] = [];
  let current: { header: tar.Header; parts: Buffer[] } | undefined;
  /** The entry before: recorded once whole (readTarEntries records an entry once its contents are read). */
  const flush = () => {
    const contents = Buffer.concat(current?.parts ?? []);
    if (current && contents.length === (current.header.type === 'file' ? current.header.size : 0)) seen.push({ header: { ...current.header }, contents: contents.toString('latin1') });
    current = undefined;
  };
  try {
    const reader = new TarPushReader(limits, undefined, (header) => {
      flush();
      const parts: Buffer[] = [];
      current = { header, parts };
      return header.type === 'file' ? (p) => parts.push(Buffer.from(p)) : undefined;
    });
    for (let at = 0; at < bytes.length; at += piece) reader.push(bytes.subarray(at, at + piece));
    reader.end();
    flush();
  } catch (err) {
    flush();
    seen.push({ error: (err as Error).message });
  }
  return seen;
}

async function packed(entries: [Partial<tar.Header> & { name: string; pax?: Record<string, string> }, string?][]): Promise<Buffer> {
  const pack = tar.pack();
  for (const [h, content] of entries) pack.entry(h, content ?? '');
  pack.finalize();
  const parts: Buffer[] = [];
  for await (const c of pack as unknown as AsyncIterable<Buffer>) parts.push(c);
  return Buffer.concat(parts);
}

const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

/** A tree on disk archived by GNU tar in `format` (gnu: long names as GNU records; posix: as pax records). */
function gnuTar(format: 'gnu' | 'posix' | 'ustar'): Buffer {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'tar-push-'));
  dirs.push(dir);
  const long = 'd'.repeat(120);
  mkdirSync(path.join(dir, 'root', long, 'sub'), { recursive: true });
  writeFileSync(path.join(dir, 'root', 'a.txt'), 'alpha\n');
  writeFileSync(path.join(dir, 'root', long, 'sub', `${'f'.repeat(90)}.bin`), Buffer.alloc(70_000, 7));
  writeFileSync(path.join(dir, 'root', 'empty'), '');
  symlinkSync(format === 'ustar' ? 'a.txt' : `${long}/sub/${'f'.repeat(90)}.bin`, path.join(dir, 'root', 'link'));
  linkSync(path.join(dir, 'root', 'a.txt'), path.join(dir, 'root', 'hard'));
  const out = path.join(dir, `${format}.tar`);
  execFileSync('tar', ['--sort=name', '--numeric-owner', `--format=${format}`, ...(format === 'posix' ? ['--pax-option=delete=atime,delete=ctime'] : []), '-cf', out, '-C', dir, ...(format === 'ustar' ? ['root/a.txt', 'root/empty', 'root/link', 'root/hard'] : ['root'])]);
  return readFileSync(out);
}

describe('TarPushReader', () => {
  const cases: [string, () => Promise<Buffer> | Buffer][] = [
    ['GNU tar, gnu format (long names and long link targets as GNU records)', () => gnuTar('gnu')],
    ['GNU tar, posix format (pax records)', () => gnuTar('posix')],
    ['GNU tar, ustar format', () => gnuTar('ustar')],
    [
      'tar-stream: prefix-split long names, pax xattrs, every type',
      () =>
        packed([
          [{ name: 'dir/', type: 'directory', mode: 0o755 }],
          [{ name: `${'p'.repeat(150)}/${'n'.repeat(80)}`, mode: 0o640, uid: 1000, gid: 1000 }, 'prefixed'],
          [{ name: 'x.bin', pax: { 'SCHILY.xattr.user.k': 'v' }, mtime: new Date(1_700_000_000_000) }, 'x'.repeat(1500)],
          [{ name: 'fifo', type: 'fifo' }],
          [{ name: 'dev', type: 'character-device', devmajor: 1, devminor: 3 }],
          [{ name: 'sym', type: 'symlink', linkname: 'x.bin' }],
          [{ name: 'hard', type: 'link', linkname: 'x.bin' }],
        ]),
    ],
  ];
  for (const [name, make] of cases) {
    it(`reads as tar-stream does, in any pieces: ${name}`, async () => {
      const bytes = await make();
      const expected = await viaTarStream(bytes);
      expect(expected.some((s) => 'error' in s)).toBe(false);
      for (const piece of [1, 7, 511, 512, 513, 4096, 65536, bytes.length]) expect(viaPush(bytes, piece), `pieces of ${piece}`).toEqual(expected);
    });
  }

  it('refuses what tar-stream refuses, with the same codes and messages', async () => {
    const good = await packed([[{ name: 'a' }, 'x'.repeat(1000)], [{ name: 'b' }, 'y']]);
    const badSum = Buffer.from(good);
    badSum[10] = badSum[10]! ^ 0xff;
    const unknownFormat = Buffer.from(good);
    unknownFormat.write('nostar', 257, 'latin1');
    // The checksum covers the magic: put it right so only the format is wrong.
    let sum = 8 * 32;
    for (let i = 0; i < 512; i++) if (i < 148 || i >= 156) sum += unknownFormat[i]!;
    unknownFormat.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 'latin1');
    for (const [what, bytes] of [
      ['cut inside contents', good.subarray(0, 700)],
      ['cut inside a header', good.subarray(0, 1536 + 100)],
      ['cut inside padding', good.subarray(0, 512 + 1000 + 5)],
      ['a bad checksum', badSum],
      ['an unknown format', unknownFormat],
    ] as const) {
      const expected = await viaTarStream(bytes);
      expect(expected.at(-1), what).toHaveProperty('error');
      expect(viaPush(bytes, 100), what).toEqual(expected);
    }
  });

  it('refuses a pax record whose size is negative (tar-stream reads on from a wrong place there)', async () => {
    const bytes = Buffer.from(await packed([[{ name: `${'q'.repeat(120)}/${'r'.repeat(120)}` }, 'x']]));
    expect(bytes[156]).toBe('x'.charCodeAt(0)); // the first record is the pax one
    bytes.write('-0000000001 ', 124, 'latin1'); // its size: -1
    let sum = 8 * 32;
    for (let i = 0; i < 512; i++) if (i < 148 || i >= 156) sum += bytes[i]!;
    bytes.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 'latin1');
    expect(viaPush(bytes, 512)).toEqual([{ error: 'malformed tar: Invalid header' }]);
  });

  it('enforces the limits as readTarEntries does', async () => {
    const bytes = await packed([[{ name: 'a' }, 'x'.repeat(3000)], [{ name: 'b' }, 'y'.repeat(3000)], [{ name: 'c' }]]);
    for (const limits of [{ maxBytes: 5000, maxEntries: 10 }, { maxBytes: 1 << 20, maxEntries: 2 }]) {
      const push = viaPush(bytes, 1000, limits).at(-1);
      expect(push).toEqual((await viaTarStream(bytes, limits)).at(-1));
      expect(push).toHaveProperty('error');
    }
  });
});
