import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, readlink, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { gunzipSync, gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RollboxError } from '../src/api/index.ts';
import { tarOf as tarOfEntries, type TarEntry } from './support/tar.ts';
import { GzippedChunks, LayerMounts, LayerStore, buildBusyboxBase, buildLayerFromTar, isMountPoint, mkfsErofs, parseChunkTable, readMountInfo, type LayerFiles } from '../src/layers/index.ts';
import { waitFor } from './support/cluster.ts';

type Entry = TarEntry;
/** Fixed times: the same entries give the same layer. */
const tarOf = (entries: Entry[]) => tarOfEntries(entries, { mtime: new Date(1_700_000_000_000) });


function sha256Hex(file: string): string {
  return createHash('sha256').update(readFileSync(file)).digest('hex');
}

function loopsOf(imagePath: string): string {
  return execFileSync('losetup', ['-j', imagePath], { encoding: 'utf8' }).trim();
}

/** The kernel detaches an autoclear loop device after its last unmount, asynchronously: under load, a little later. */
async function loopsGone(imagePath: string): Promise<void> {
  await waitFor(`the loop device of ${imagePath} detached`, async () => loopsOf(imagePath) === '');
}

let top: string;
let store: LayerStore;
let tmpDir: string;
let outside: string;
const mountsToClean: LayerMounts[] = [];

beforeAll(async () => {
  top = await mkdtemp(path.join(os.tmpdir(), 'rollbox-layers-'));
  store = new LayerStore(path.join(top, 'store'));
  tmpDir = path.join(top, 'work', 'tmp');
  outside = path.join(top, 'work');
  await mkdir(tmpDir, { recursive: true });
});

afterAll(async () => {
  for (const m of mountsToClean) await m.reconcile(new Set()).catch(() => undefined);
  // Last resort for anything a failed test left mounted under our temp dir.
  for (const line of readFileSync('/proc/self/mounts', 'utf8').split('\n')) {
    const mp = line.split(' ')[1];
    if (mp && mp.startsWith(`${top}/`)) execFileSync('umount', ['-l', mp]);
  }
  await rm(top, { recursive: true, force: true });
});

async function expectRefused(entries: Entry[], code: string = 'invalid_layer', opts: { maxBytes?: number; maxEntries?: number } = {}): Promise<void> {
  const before = await readdir(outside);
  const err = await buildLayerFromTar(Readable.from(await tarOf(entries)), { store, tmpDir, maxBytes: opts.maxBytes ?? 1 << 20, ...(opts.maxEntries ? { maxEntries: opts.maxEntries } : {}) }).then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(RollboxError);
  expect((err as RollboxError).code).toBe(code);
  // Nothing left behind: no scratch dir, nothing new beside it.
  expect(await readdir(tmpDir)).toEqual([]);
  expect(await readdir(outside)).toEqual(before);
}

describe('buildLayerFromTar safety', () => {
  const marker = `rollbox-test-${randomBytes(4).toString('hex')}`;

  it('refuses ../ entries', async () => {
    await expectRefused([{ name: `../${marker}`, type: 'file', content: 'x' }]);
    await expectRefused([{ name: `a/../../${marker}`, type: 'file', content: 'x' }]);
    expect(existsSync(path.join(top, marker))).toBe(false);
  });

  it('refuses absolute entries', async () => {
    await expectRefused([{ name: `/etc/${marker}`, type: 'file', content: 'x' }]);
    expect(existsSync(`/etc/${marker}`)).toBe(false);
  });

  it('refuses writing through a symlink, even an allowed absolute one', async () => {
    await expectRefused([
      { name: 'etcdir', type: 'symlink', linkname: '/etc' },
      { name: `etcdir/${marker}`, type: 'file', content: 'x' },
    ]);
    expect(existsSync(`/etc/${marker}`)).toBe(false);
    await expectRefused([
      { name: 'up', type: 'symlink', linkname: '..' },
      { name: `up/${marker}`, type: 'file', content: 'x' },
    ]);
    // A symlink replacing a directory that later entries write into.
    await expectRefused([
      { name: 'd/', type: 'directory' },
      { name: 'd', type: 'symlink', linkname: '/tmp' },
      { name: `d/${marker}`, type: 'file', content: 'x' },
    ]);
    expect(existsSync(`/tmp/${marker}`)).toBe(false);
  });

  it('refuses symlinks resolving outside the layer', async () => {
    await expectRefused([{ name: 'a/l', type: 'symlink', linkname: '../../etc/passwd' }]);
  });

  it('refuses hardlinks pointing outside or at non-files', async () => {
    await expectRefused([{ name: 'h', type: 'link', linkname: '../../../etc/passwd' }]);
    await expectRefused([{ name: 'h', type: 'link', linkname: '/etc/passwd' }]);
    await expectRefused([
      { name: 's', type: 'symlink', linkname: '/etc/passwd' },
      { name: 'h', type: 'link', linkname: 's' },
    ]);
    await expectRefused([{ name: 'h', type: 'link', linkname: 'missing' }]);
  });

  it('refuses device nodes and fifos', async () => {
    await expectRefused([{ name: 'dev/sda', type: 'block-device', devmajor: 8, devminor: 0 }]);
    await expectRefused([{ name: 'dev/mem', type: 'character-device', devmajor: 1, devminor: 1 }]);
    await expectRefused([{ name: 'fifo', type: 'fifo' }]);
  });

  it('refuses data that is not a tar', async () => {
    const err = await buildLayerFromTar(Readable.from(Buffer.from('definitely not a tar archive '.repeat(40))), { store, tmpDir, maxBytes: 1 << 20 }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'invalid_layer' });
    expect(await readdir(tmpDir)).toEqual([]);
  });

  it('enforces the byte and entry caps', async () => {
    await expectRefused([{ name: 'big', type: 'file', content: 'x'.repeat(2000) }], 'payload_too_large', { maxBytes: 1000 });
    await expectRefused(
      Array.from({ length: 20 }, (_, i) => ({ name: `f${i}`, type: 'file' as const, content: 'x' })),
      'payload_too_large',
      { maxEntries: 10 },
    );
  });
});

describe('buildLayerFromTar', () => {
  const entries: Entry[] = [
    { name: './', type: 'directory', mode: 0o755 },
    { name: 'app/', type: 'directory', mode: 0o750, uid: 1000, gid: 1000 },
    { name: 'app/main.sh', type: 'file', mode: 0o755, content: '#!/bin/sh\necho hi\n', uid: 1000, gid: 1000 },
    { name: 'app/lib/data.txt', type: 'file', mode: 0o644, content: 'data', mtime: new Date(1_600_000_000_000) },
    { name: 'app/link', type: 'symlink', linkname: 'lib/data.txt' },
    { name: 'app/abs', type: 'symlink', linkname: '/etc/passwd' },
    { name: 'app/hard', type: 'link', linkname: 'app/main.sh' },
    { name: 'suid', type: 'file', mode: 0o4755, content: 'x' },
  ];

  it('builds a reproducible image with the tar contents, plain or gzipped', async () => {
    const raw = await tarOf(entries);
    const a = await buildLayerFromTar(Readable.from(raw), { store, tmpDir, maxBytes: 1 << 20 });
    const b = await buildLayerFromTar(Readable.from(gzipSync(raw)), { store, tmpDir, maxBytes: 1 << 20 });
    const tarFile = path.join(top, 'layer.tar');
    await writeFile(tarFile, raw);
    const c = await buildLayerFromTar(tarFile, { store, tmpDir, maxBytes: 1 << 20 });
    expect(a.digest).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(b.digest).toBe(a.digest);
    expect(c.digest).toBe(a.digest);
    // A split layer: the digest is the chunk table's sha256, and the table names the meta's and every chunk's.
    const paths = store.splitPathsOf(a.digest);
    expect(a.files).toEqual({ digest: a.digest, imagePath: paths.metaPath, blobPath: paths.blobPath });
    expect(sha256Hex(paths.tablePath)).toBe(a.digest.slice(7));
    const table = parseChunkTable(readFileSync(paths.tablePath), a.digest);
    expect(table.meta.sha256).toBe(sha256Hex(paths.metaPath));
    expect(table.chunks).toEqual([createHash('sha256').update(readFileSync(paths.blobPath)).digest('hex')]);
    expect((await stat(paths.metaPath)).size + (await stat(paths.blobPath)).size).toBe(a.sizeBytes);
    expect(await store.has(a.digest)).toBe(true);
    expect(await readdir(tmpDir)).toEqual([]);

    const mounts = new LayerMounts({ dataDir: path.join(top, 'node-a'), storeDir: store.dir });
    mountsToClean.push(mounts);
    const dir = await mounts.acquire(a.files);
    try {
      expect(await readFile(path.join(dir, 'app/main.sh'), 'utf8')).toBe('#!/bin/sh\necho hi\n');
      expect(await readlink(path.join(dir, 'app/link'))).toBe('lib/data.txt');
      expect(await readlink(path.join(dir, 'app/abs'))).toBe('/etc/passwd');
      const main = await stat(path.join(dir, 'app/main.sh'));
      const hard = await stat(path.join(dir, 'app/hard'));
      expect(hard.ino).toBe(main.ino);
      expect(main.uid).toBe(1000);
      expect(main.mode & 0o7777).toBe(0o755);
      expect((await stat(path.join(dir, 'app'))).mode & 0o7777).toBe(0o750);
      expect((await stat(path.join(dir, 'suid'))).mode & 0o7777).toBe(0o4755);
      expect((await stat(path.join(dir, 'app/lib/data.txt'))).mtimeMs).toBe(1_600_000_000_000);
      expect((await stat(path.join(dir, 'app/main.sh'))).mtimeMs).toBe(1_700_000_000_000);
      // File-backed: the meta image with the blob as its device, no loop device.
      expect((await readMountInfo()).find((m) => m.mountPoint === dir)).toMatchObject({ fsType: 'erofs', source: paths.metaPath });
      expect(loopsOf(paths.metaPath) + loopsOf(paths.blobPath)).toBe('');
    } finally {
      await mounts.release(a.digest);
    }
    expect(isMountPoint(dir)).toBe(false);
  });

  it('later entries replace earlier ones (tar semantics) without following links', async () => {
    const layer = await buildLayerFromTar(
      Readable.from(
        await tarOf([
          { name: 'x', type: 'symlink', linkname: '/etc/passwd' },
          { name: 'x', type: 'file', content: 'replaced' },
        ]),
      ),
      { store, tmpDir, maxBytes: 1 << 20 },
    );
    expect(await store.has(layer.digest)).toBe(true);
    expect(readFileSync('/etc/passwd', 'utf8')).not.toBe('replaced');
  });
});

describe('buildBusyboxBase', () => {
  it('is reproducible and has busybox, applets and the basic files', async () => {
    const a = await buildBusyboxBase({ store, tmpDir });
    const b = await buildBusyboxBase({ store, tmpDir });
    expect(b.digest).toBe(a.digest);
    const mounts = new LayerMounts({ dataDir: path.join(top, 'node-b'), storeDir: store.dir });
    mountsToClean.push(mounts);
    const dir = await mounts.acquire(a.files);
    try {
      expect((await stat(path.join(dir, 'bin/busybox'))).mode & 0o777).toBe(0o755);
      expect(await readlink(path.join(dir, 'bin/sh'))).toBe('/bin/busybox');
      expect(await readFile(path.join(dir, 'etc/passwd'), 'utf8')).toMatch(/^root:x:0:0:/m);
      expect(await readFile(path.join(dir, 'etc/group'), 'utf8')).toMatch(/^nobody:x:65534:/m);
      expect((await stat(path.join(dir, 'tmp'))).mode & 0o7777).toBe(0o1777);
      for (const d of ['proc', 'sys', 'dev', 'root']) expect((await stat(path.join(dir, d))).isDirectory()).toBe(true);
      expect(await readFile(path.join(dir, 'etc/resolv.conf'), 'utf8')).toBe('');
    } finally {
      await mounts.release(a.digest);
    }
  });
});

/** A single-image layer, as older data dirs hold them (and as snapshots are stored): one EROFS image whose sha256 is its digest. */
async function singleImageLayer(content: string): Promise<LayerFiles> {
  const work = await mkdtemp(path.join(tmpDir, 'single-'));
  try {
    await mkdir(path.join(work, 'root'));
    await writeFile(path.join(work, 'root', 'f'), content);
    await mkfsErofs(path.join(work, 'root'), path.join(work, 'image.erofs'));
    return (await store.put(path.join(work, 'image.erofs'))).files;
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

describe('LayerStore', () => {
  it('puts idempotently and removes', async () => {
    const f1 = path.join(top, 'img1');
    const f2 = path.join(top, 'img2');
    await writeFile(f1, 'same bytes');
    await writeFile(f2, 'same bytes');
    const a = await store.put(f1);
    const b = await store.put(f2);
    expect(b).toEqual({ ...a, added: false });
    expect(a.added).toBe(true);
    expect(existsSync(f1) || existsSync(f2)).toBe(false);
    expect(a.digest).toBe(`sha256:${createHash('sha256').update('same bytes').digest('hex')}`);
    expect(await store.locate(a.digest)).toEqual({ digest: a.digest, imagePath: store.imagePathOf(a.digest) });
    expect(await store.list()).toContain(a.digest);
    await store.remove(a.digest);
    expect(await store.has(a.digest)).toBe(false);
    expect(() => store.imagePathOf('sha256:../../etc')).toThrow(RollboxError);
  });

  it('stores a split layer once, and removes all its files', async () => {
    const raw = await tarOf([{ name: 'x', type: 'file', content: 'split me' }]);
    const a = await buildLayerFromTar(Readable.from(raw), { store, tmpDir, maxBytes: 1 << 20 });
    const again = await buildLayerFromTar(Readable.from(raw), { store, tmpDir, maxBytes: 1 << 20 });
    expect(again.digest).toBe(a.digest);
    expect(await store.list()).toContain(a.digest);
    expect(await store.storedAtMs(a.digest)).toBeGreaterThan(0);
    await store.remove(a.digest);
    expect(await store.has(a.digest)).toBe(false);
    expect(Object.values(store.splitPathsOf(a.digest)).filter((p) => existsSync(p))).toEqual([]);
  });

  it('gzips blob chunks once and serves runs of them as gzip members; other ranges gzipped as they are; removed with the layer', async () => {
    // A few chunks of 1 MiB and a short last one.
    const data = randomBytes(3 * 1024 * 1024 + 4096);
    const raw = await tarOf([{ name: 'big', type: 'file', content: data.toString('latin1') }]);
    const layer = await buildLayerFromTar(Readable.from(raw), { store, tmpDir, maxBytes: 8 << 20 });
    const { blobPath } = store.splitPathsOf(layer.digest);
    const blob = readFileSync(blobPath);
    const table = parseChunkTable((await store.chunkTable(layer.digest))!);
    const chunks = new GzippedChunks(store, 1);
    const whole = async (pieces: AsyncIterable<Buffer>): Promise<Buffer> => {
      const got: Buffer[] = [];
      for await (const p of pieces) got.push(p);
      return Buffer.concat(got);
    };
    const run = await whole(chunks.range(layer.digest, blobPath, table.chunkSizeBytes, blob.length - 1)); // chunks 1 to the last
    expect(gunzipSync(run).equals(blob.subarray(table.chunkSizeBytes))).toBe(true);
    const madeAll = table.chunks.slice(1).map((_c, i) => String(i + 1)).sort();
    expect(madeAll.length).toBeGreaterThan(2);
    expect((await readdir(store.gzippedChunksDirOf(layer.digest))).sort()).toEqual(madeAll);
    // Kept: served from the files (a changed file shows), not gzipped again.
    const one = path.join(store.gzippedChunksDirOf(layer.digest), '1');
    const firstMade = (await stat(one)).mtimeMs;
    expect(gunzipSync(await whole(chunks.range(layer.digest, blobPath, table.chunkSizeBytes, 2 * table.chunkSizeBytes - 1))).equals(blob.subarray(table.chunkSizeBytes, 2 * table.chunkSizeBytes))).toBe(true);
    expect((await stat(one)).mtimeMs).toBe(firstMade);
    // Not whole chunks: those bytes, gzipped now, nothing kept.
    expect(gunzipSync(await whole(chunks.range(layer.digest, blobPath, 10, 5000))).equals(blob.subarray(10, 5001))).toBe(true);
    expect((await readdir(store.gzippedChunksDirOf(layer.digest))).sort()).toEqual(madeAll);
    await store.remove(layer.digest);
    expect(existsSync(store.gzippedChunksDirOf(layer.digest))).toBe(false);
  });
});

describe('LayerMounts', () => {
  it('mounts once under concurrency and unmounts at zero (split, file-backed)', async () => {
    const layer = await buildBusyboxBase({ store, tmpDir });
    const mounts = new LayerMounts({ dataDir: path.join(top, 'node-c'), storeDir: store.dir });
    mountsToClean.push(mounts);
    const [d1, d2, d3] = await Promise.all([1, 2, 3].map(() => mounts.acquire(layer.files)));
    expect(d1).toBe(d2);
    expect(d2).toBe(d3);
    const lines = readFileSync('/proc/self/mounts', 'utf8').split('\n').filter((l) => l.split(' ')[1] === d1);
    expect(lines).toHaveLength(1);
    expect(mounts.mounted()).toEqual([layer.digest]);
    expect(loopsOf(layer.files.imagePath) + loopsOf(layer.files.blobPath!)).toBe('');
    await mounts.release(layer.digest);
    await mounts.release(layer.digest);
    expect(isMountPoint(d1!)).toBe(true);
    // A release racing a new acquire must leave it mounted for the new holder.
    const [, again] = await Promise.all([mounts.release(layer.digest), mounts.acquire(layer.files)]);
    expect(isMountPoint(again)).toBe(true);
    await mounts.release(layer.digest);
    expect(isMountPoint(d1!)).toBe(false);
    expect(mounts.mounted()).toEqual([]);
  });

  it('still mounts single-image layers (loop device, detached at zero)', async () => {
    const layer = await singleImageLayer('from an older data dir');
    const mounts = new LayerMounts({ dataDir: path.join(top, 'node-e'), storeDir: store.dir });
    mountsToClean.push(mounts);
    const dir = await mounts.acquire(layer);
    expect(await readFile(path.join(dir, 'f'), 'utf8')).toBe('from an older data dir');
    expect(loopsOf(layer.imagePath)).not.toBe('');
    await mounts.release(layer.digest);
    expect(isMountPoint(dir)).toBe(false);
    await loopsGone(layer.imagePath);
  });

  it('reconcile removes mounts left by a previous process and keeps the ones in use', async () => {
    const keepLayer = await buildBusyboxBase({ store, tmpDir });
    const other = await buildLayerFromTar(Readable.from(await tarOf([{ name: 'f', type: 'file', content: 'other' }])), { store, tmpDir, maxBytes: 1 << 20 });
    const single = await singleImageLayer('single');
    const dataDir = path.join(top, 'node-d');
    const previous = new LayerMounts({ dataDir, storeDir: store.dir });
    const keepDir = await previous.acquire(keepLayer.files);
    const otherDir = await previous.acquire(other.files);
    const singleDir = await previous.acquire(single);
    // "Restart": a fresh instance knows nothing of those mounts.
    const mounts = new LayerMounts({ dataDir, storeDir: store.dir });
    mountsToClean.push(mounts);
    const result = await mounts.reconcile(new Set([keepLayer.digest]));
    expect(result.unmounted.sort()).toEqual([other.digest, single.digest].sort());
    expect([otherDir, singleDir].filter((d) => isMountPoint(d) || existsSync(d))).toEqual([]);
    await loopsGone(single.imagePath);
    expect(isMountPoint(keepDir)).toBe(true);
    // Adopting the surviving mount is a refcount, and the last release unmounts it.
    expect(await mounts.acquire(keepLayer.files)).toBe(keepDir);
    expect(readFileSync('/proc/self/mounts', 'utf8').split('\n').filter((l) => l.split(' ')[1] === keepDir)).toHaveLength(1);
    await mounts.release(keepLayer.digest);
    expect(isMountPoint(keepDir)).toBe(false);
  });
});
