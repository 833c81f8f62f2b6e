import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ExtractWorkers, extractInThread } from '../src/layers/index.ts';
import { layerTar } from './support/oci.ts';

/** Layer extraction on worker threads: the same result as in the calling thread, errors typed, backpressure, queueing. */
let dir: string;
const workers = new ExtractWorkers(2);
const limits = { maxBytes: 64 << 20, maxEntries: 10_000 };

beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-extract-workers-'));
});
afterAll(async () => {
  await workers.close();
  await fs.rm(dir, { recursive: true, force: true });
});

/** A stream of `buf` in small chunks, counting how many were read. */
function chunked(buf: Buffer, size = 4096): { stream: Readable; read: () => number } {
  let read = 0;
  const stream = Readable.from(
    (function* () {
      for (let i = 0; i < buf.length; i += size) {
        read++;
        yield buf.subarray(i, i + size);
      }
    })(),
  );
  return { stream, read: () => read };
}

describe('ExtractWorkers', () => {
  it('extracts on a thread what extraction in this thread gives, and hashes the decompressed tar', async () => {
    const tar = await layerTar([
      { name: 'a/', type: 'directory', mode: 0o750, uid: 1000, gid: 1000 },
      { name: 'a/big', content: Buffer.alloc(3 << 20, 7), mode: 0o640 },
      { name: 'a/link', type: 'symlink', linkname: 'big' },
      { name: 'a/.wh.gone' },
      { name: 'a/note', content: 'x', pax: { 'SCHILY.xattr.user.k': 'v' } },
    ]);
    const [mine, theirs] = [path.join(dir, 'thread'), path.join(dir, 'here')];
    await Promise.all([fs.mkdir(mine), fs.mkdir(theirs)]);
    const onThread = await workers.extract(chunked(gzipSync(tar)).stream, { kind: 'tree', root: mine }, limits, { imageLayer: true });
    const here = await extractInThread(Readable.from([tar]), { kind: 'tree', root: theirs }, limits, { imageLayer: true });
    expect(onThread.tarSha256).toBe(createHash('sha256').update(tar).digest('hex'));
    expect(here.tarSha256).toBe(onThread.tarSha256);
    for (const root of [mine, theirs]) {
      const st = await fs.stat(path.join(root, 'a'));
      expect([st.mode & 0o7777, st.uid, st.gid]).toEqual([0o750, 1000, 1000]);
      expect((await fs.stat(path.join(root, 'a/big'))).size).toBe(3 << 20);
      expect(await fs.readlink(path.join(root, 'a/link'))).toBe('big');
      expect((await fs.lstat(path.join(root, 'a/gone'))).isCharacterDevice()).toBe(true);
    }
    // Straight into a split EROFS layer: the thread's files and chunk table are those of the calling thread.
    const erofs = await Promise.all(
      ['thread-erofs', 'here-erofs'].map(async (name, i) => {
        const files = { metaPath: path.join(dir, `${name}.meta`), blobPath: path.join(dir, `${name}.blob`), chunkSizeBytes: 1 << 20 };
        const read = i === 0 ? await workers.extract(chunked(gzipSync(tar)).stream, { kind: 'erofs', files }, limits, { imageLayer: true }) : await extractInThread(Readable.from([tar]), { kind: 'erofs', files }, limits, { imageLayer: true });
        return { read, meta: await fs.readFile(files.metaPath) };
      }),
    );
    expect(erofs[0]!.read.tarSha256).toBe(onThread.tarSha256);
    expect(erofs[0]!.read.table?.toString()).toBe(erofs[1]!.read.table?.toString());
    expect(erofs[0]!.meta.equals(erofs[1]!.meta)).toBe(true);
  });

  it('answers a refused entry as the typed error naming it, and stops reading the upload', async () => {
    const tar = await layerTar([{ name: '../outside', content: 'x' }, { name: 'filler', content: Buffer.alloc(8 << 20) }]);
    const root = path.join(dir, 'refused');
    await fs.mkdir(root);
    const input = chunked(tar);
    await expect(workers.extract(input.stream, { kind: 'tree', root }, limits, {})).rejects.toMatchObject({ code: 'invalid_layer', message: expect.stringContaining('"../outside"') });
    // 8 MiB in 4 KiB chunks is 2,000 chunks: far fewer were read before the refusal stopped it (about 1 MiB is in flight to the thread).
    expect(input.read()).toBeLessThan(600);
    await expect(fs.stat(path.join(dir, 'outside'))).rejects.toThrow();
  });

  it('queues jobs past its threads, and each gets its own result', async () => {
    const tars = await Promise.all(Array.from({ length: 5 }, (_, i) => layerTar([{ name: `f${i}`, content: `${i}`.repeat(100_000) }])));
    const results = await Promise.all(
      tars.map(async (tar, i) => {
        const root = path.join(dir, `q${i}`);
        await fs.mkdir(root);
        const r = await workers.extract(chunked(tar).stream, { kind: 'tree', root }, limits, {});
        expect(await fs.readFile(path.join(root, `f${i}`), 'utf8')).toBe(`${i}`.repeat(100_000));
        return r.tarSha256;
      }),
    );
    expect(results).toEqual(tars.map((t) => createHash('sha256').update(t).digest('hex')));
  });
});
