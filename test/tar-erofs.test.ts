/**
 * The tar-to-EROFS writer (src/layers/tar-erofs) against the way it replaces: the safe
 * extractor then mkfs.erofs. The same tars go both ways; both layers are mounted as a
 * worker mounts them (rollbox-gate, `device=<blob>`) and every file's type, mode, owner,
 * mtime, size, contents, link target, link count, hard-link grouping and xattrs compared.
 */
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RollboxError } from '../src/api/index.ts';
import { DEFAULT_GATE_BINARY } from '../src/layers/mounts.ts';
import { LAYER_CHUNK_BYTES, chunkTableOf, extractTarSafely, mkfsErofs, parseChunkTable } from '../src/layers/index.ts';
import { writeErofsLayerFromTar } from '../src/layers/tar-erofs/index.ts';
import { CAP_NET_RAW, imageFixtureLayers } from './support/image-fixture.ts';
import { layerTar, type TarEntry } from './support/oci.ts';

let work: string;
const mounted: string[] = [];
const LIMITS = { maxBytes: 1 << 30, maxEntries: 1_000_000 };

beforeAll(() => {
  execFileSync('sh', ['scripts/build-gate.sh'], { stdio: 'ignore' });
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'rollbox-tar-erofs-'));
});
afterAll(() => {
  for (const dir of mounted.splice(0)) execFileSync('umount', [dir]);
  fs.rmSync(work, { recursive: true, force: true });
});

/** As a socket or file gives it: in 64 KiB pieces. */
function streamOf(buf: Buffer): Readable {
  const pieces: Buffer[] = [];
  for (let at = 0; at < buf.length; at += 65536) pieces.push(buf.subarray(at, at + 65536));
  return Readable.from(pieces);
}

let seq = 0;
/** Both ways: answers the two mount points and the writer's chunk table. */
async function bothWays(tar: Buffer, imageLayer = true): Promise<{ reference: string; written: string; table: Buffer }> {
  const dir = path.join(work, `case-${seq++}`);
  fs.mkdirSync(path.join(dir, 'root'), { recursive: true });
  await extractTarSafely(streamOf(tar), path.join(dir, 'root'), LIMITS, { imageLayer });
  await mkfsErofs(path.join(dir, 'root'), path.join(dir, 'ref.meta'), { keepXattrs: imageLayer, blob: { path: path.join(dir, 'ref.blob'), chunkSizeBytes: LAYER_CHUNK_BYTES } });
  fs.appendFileSync(path.join(dir, 'ref.blob'), '');
  const files = { metaPath: path.join(dir, 'w.meta'), blobPath: path.join(dir, 'w.blob'), chunkSizeBytes: LAYER_CHUNK_BYTES };
  const table = await writeErofsLayerFromTar(streamOf(tar), files, LIMITS, { imageLayer });
  const mount = (meta: string, blob: string, at: string): string => {
    fs.mkdirSync(at);
    execFileSync(DEFAULT_GATE_BINARY, ['mount', meta, at, blob]);
    mounted.push(at);
    return at;
  };
  return { reference: mount(path.join(dir, 'ref.meta'), path.join(dir, 'ref.blob'), path.join(dir, 'm-ref')), written: mount(files.metaPath, files.blobPath, path.join(dir, 'm-w')), table };
}

/** Everything a reader of the tree can see, path by path (inode numbers as groups: which paths share one). */
function view(root: string): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  const groups = new Map<bigint, string>();
  const walk = (rel: string): void => {
    const p = path.join(root, rel);
    const st = fs.lstatSync(p, { bigint: true });
    const first = groups.get(st.ino) ?? rel;
    groups.set(st.ino, first);
    const entry: Record<string, unknown> = { mode: st.mode.toString(8), uid: st.uid, gid: st.gid, mtimeMs: st.mtimeMs, nlink: st.nlink, rdev: st.rdev, sameAs: first };
    if (st.isFile()) Object.assign(entry, { size: st.size, sha256: createHash('sha256').update(fs.readFileSync(p)).digest('hex') });
    else if (st.isSymbolicLink()) entry.target = fs.readlinkSync(p);
    else if (st.isDirectory()) Object.assign(entry, { size: st.size, names: fs.readdirSync(p).sort() });
    out[rel || '.'] = entry;
    if (st.isDirectory()) for (const name of fs.readdirSync(p).sort()) walk(path.join(rel, name));
  };
  walk('');
  out.xattrs = execFileSync('getfattr', ['-R', '-h', '-d', '-m', '-', '-e', 'hex', '.'], { cwd: root, encoding: 'utf8' });
  return out;
}

/** A layer of what trips layer builders: replacement rules, links, big and empty files, a multi-block directory, long names and targets, ACLs. */
function trickyEntries(): TarEntry[] {
  const acl = (entries: [number, number, number][]): string => {
    const b = Buffer.alloc(4 + 8 * entries.length);
    b.writeUInt32LE(2, 0);
    entries.forEach(([tag, perm, id], i) => {
      b.writeUInt16LE(tag, 4 + 8 * i);
      b.writeUInt16LE(perm, 6 + 8 * i);
      b.writeUInt32LE(id, 8 + 8 * i);
    });
    return b.toString('base64');
  };
  const many: TarEntry[] = Array.from({ length: 700 }, (_, i) => ({ name: `wide/entry-with-a-longer-name-${String(i).padStart(4, '0')}`, content: `${i}\n`, mtime: new Date(1_700_000_000_000 + i * 1001) }));
  return [
    { name: './', type: 'directory', mode: 0o711, mtime: new Date(1_600_000_000_000) },
    { name: 'deep/a/b/c/d/file', content: 'deep\n', uid: 7, gid: 8 },
    { name: 'deep/a/', type: 'directory', mode: 0o700, uid: 5, gid: 6, mtime: new Date(1_500_000_000_123) },
    { name: 'big', content: randomBytes(3 * LAYER_CHUNK_BYTES + 12345) },
    { name: 'exactly-a-chunk', content: randomBytes(LAYER_CHUNK_BYTES) },
    { name: 'empty', content: '' },
    { name: 'replaced-dir/child', content: 'gone\n' },
    { name: 'replaced-dir', content: 'a file now\n' },
    { name: 'replaced-file', content: 'gone\n' },
    { name: 'replaced-file/', type: 'directory', mode: 0o750 },
    { name: 'kept-dir/child', content: 'kept\n' },
    { name: 'kept-dir/', type: 'directory', mode: 0o705, mtime: new Date(1_400_000_000_000) },
    { name: 'links/one', content: 'shared\n', mode: 0o640 },
    { name: 'links/two', type: 'link', linkname: 'links/one' },
    { name: 'links/three', type: 'link', linkname: 'links/one' },
    { name: 'links/one', content: 'replaced: the others keep the old inode\n' },
    { name: 'links/self', content: 'x' },
    { name: 'links/self', type: 'link', linkname: 'links/self' },
    { name: 'long-target', type: 'symlink', linkname: `${'a/'.repeat(1500)}end` },
    { name: 'n'.repeat(200), content: 'a long name\n' },
    ...many,
    { name: 'wide/.wh.gone', content: '' },
    { name: 'wide/entry-with-a-longer-name-0001', content: 'after its whiteout\n' },
    { name: 'sub/.wh..wh..opq', content: '' },
    { name: 'sub/x', content: 'x\n' },
    { name: 'caps', content: 'x', mode: 0o2755, pax: { 'LIBARCHIVE.xattr.security.capability': CAP_NET_RAW.toString('base64'), 'SCHILY.xattr.user.a': 'one', 'SCHILY.xattr.user.b': 'two', 'SCHILY.xattr.security.selinux': 'dropped' } },
    { name: 'acl-equiv', content: 'x', mode: 0o600, pax: { 'LIBARCHIVE.xattr.system.posix_acl_access': acl([[1, 7, 0xffffffff], [4, 5, 0xffffffff], [0x20, 4, 0xffffffff]]) } },
    { name: 'acl-mask', content: 'x', mode: 0o600, pax: { 'LIBARCHIVE.xattr.system.posix_acl_access': acl([[1, 6, 0xffffffff], [2, 4, 1000], [4, 4, 0xffffffff], [0x10, 6, 0xffffffff], [0x20, 0, 0xffffffff]]) } },
    { name: 'acl-dir/', type: 'directory', pax: { 'LIBARCHIVE.xattr.system.posix_acl_default': acl([[1, 7, 0xffffffff], [4, 5, 0xffffffff], [0x20, 5, 0xffffffff]]) } },
    { name: 'sticky/', type: 'directory', mode: 0o1777 },
    { name: 'pipe', type: 'fifo', mode: 0o620, uid: 3, gid: 4, mtime: new Date(1_300_000_000_000) },
  ];
}

describe('tar to EROFS without extracting', () => {
  it('gives the files extract + mkfs.erofs give, for the image fixture and a layer of edge cases', async () => {
    const { base, upper } = await imageFixtureLayers();
    for (const tar of [base, upper, await layerTar(trickyEntries())]) {
      const { reference, written } = await bothWays(tar);
      expect(view(written)).toEqual(view(reference));
    }
    // The longest name Linux allows, which mkfs.erofs 1.5 cannot format ("No such file or directory").
    const longest = `${'n'.repeat(254)}x`;
    const dir = fs.mkdtempSync(path.join(work, 'longest-'));
    await writeErofsLayerFromTar(streamOf(await layerTar([{ name: `d/${longest}`, content: 'longest\n' }])), { metaPath: path.join(dir, 'm'), blobPath: path.join(dir, 'b'), chunkSizeBytes: LAYER_CHUNK_BYTES }, LIMITS);
    fs.mkdirSync(path.join(dir, 'mnt'));
    execFileSync(DEFAULT_GATE_BINARY, ['mount', path.join(dir, 'm'), path.join(dir, 'mnt'), path.join(dir, 'b')]);
    mounted.push(path.join(dir, 'mnt'));
    expect(fs.readFileSync(path.join(dir, 'mnt', 'd', longest), 'utf8')).toBe('longest\n');
  });

  it('gives the files of a real tree of this host (a tar of /usr/lib/python3), and an upload layer without xattrs', async () => {
    const source = fs.existsSync('/usr/lib/python3') ? '/usr/lib/python3' : '/usr/share/perl5';
    const tar = execFileSync('tar', ['-C', path.dirname(source), '-c', '--xattrs', path.basename(source)], { maxBuffer: 1 << 30 });
    const gz = gzipSync(tar, { level: 1 });
    const { reference, written } = await bothWays(gz);
    expect(view(written)).toEqual(view(reference));
    const plain = await bothWays(tar, false);
    expect(view(plain.written)).toEqual(view(plain.reference));
  });

  it('answers a chunk table that describes what it wrote, the same for the same tar', async () => {
    const tar = await layerTar(trickyEntries());
    const { table } = await bothWays(tar);
    const dir = path.join(work, `case-${seq - 1}`);
    expect(parseChunkTable(table)).toEqual(parseChunkTable(await chunkTableOf(path.join(dir, 'w.meta'), path.join(dir, 'w.blob'), LAYER_CHUNK_BYTES)));
    expect((await bothWays(tar)).table.equals(table)).toBe(true);
  });

  it('reads an overlay upper dir\'s tar (a microVM snapshot) as mkfs.erofs keeps the dir: whiteouts, opaque marks, .wh. names plain, excluded paths left out', async () => {
    // An upper dir as overlayfs leaves it, and the container tier's snapshot of it (mkfs.erofs, xattrs kept, paths excluded).
    const dir = fs.mkdtempSync(path.join(work, 'upper-'));
    const upper = path.join(dir, 'upper');
    const sh = (script: string): void => void execFileSync('sh', ['-c', script], { cwd: upper });
    fs.mkdirSync(upper);
    sh(['mkdir -p opq/sub kept answers/deep && echo in > opq/sub/file && echo 42 > answers/deep/ref && echo keep > answersx', 'setfattr -n trusted.overlay.opaque -v y opq && setfattr -n user.note -v hi kept', 'mknod -m 0 gone c 0 0 && mknod -m 0 kept/also-gone c 0 0', 'echo plain > .wh.plain && echo x > kept/.wh..wh..opq', 'ln -s ../../../../etc/passwd climb && echo one > one && ln one two && mkfifo pipe',
      // Whole seconds: a tar's mtimes have no more (the guest's snapshot stream neither).
      'find . -exec touch -h -d @1700000000 {} +'].join(' && '));
    const exclude = ['answers'];
    await mkfsErofs(upper, path.join(dir, 'ref.meta'), { keepXattrs: true, excludePaths: exclude, blob: { path: path.join(dir, 'ref.blob'), chunkSizeBytes: LAYER_CHUNK_BYTES } });
    fs.appendFileSync(path.join(dir, 'ref.blob'), '');
    const tar = execFileSync('tar', ['-C', upper, '-c', '--xattrs', '--xattrs-include=*', '.']);
    const files = { metaPath: path.join(dir, 'w.meta'), blobPath: path.join(dir, 'w.blob'), chunkSizeBytes: LAYER_CHUNK_BYTES };
    await writeErofsLayerFromTar(streamOf(tar), files, LIMITS, { upperDir: true, excludePaths: exclude });
    const mount = (meta: string, blob: string, at: string): string => {
      fs.mkdirSync(at);
      execFileSync(DEFAULT_GATE_BINARY, ['mount', meta, at, blob]);
      mounted.push(at);
      return at;
    };
    const reference = mount(path.join(dir, 'ref.meta'), path.join(dir, 'ref.blob'), path.join(dir, 'm-ref'));
    const written = mount(files.metaPath, files.blobPath, path.join(dir, 'm-w'));
    // A whiteout's time is never seen through the overlay (it hides its name): the writer gives it 0, as an image layer's.
    const whiteoutsTimeless = (v: Record<string, unknown>) => ({ ...v, gone: { ...(v.gone as object), mtimeMs: 0n }, 'kept/also-gone': { ...(v['kept/also-gone'] as object), mtimeMs: 0n } });
    const seen = view(written);
    expect(whiteoutsTimeless(seen)).toEqual(whiteoutsTimeless(view(reference)));
    expect(Object.keys(seen)).toEqual(expect.arrayContaining(['.wh.plain', 'kept/.wh..wh..opq', 'answersx', 'gone']));
    expect(Object.keys(seen)).not.toContain('answers');
    expect(seen.xattrs).toContain('trusted.overlay.opaque=0x79');

    // Overlay marks other than a directory's opaque "y" are refused, as an upload's trusted.* are.
    const refused: [TarEntry[], RegExp][] = [
      [[{ name: 'f', content: 'x', pax: { 'SCHILY.xattr.trusted.overlay.opaque': 'y' } }], /trusted/],
      [[{ name: 'd/', type: 'directory', pax: { 'SCHILY.xattr.trusted.overlay.opaque': 'x' } }], /is not "y"/],
      [[{ name: 'd/', type: 'directory', pax: { 'SCHILY.xattr.trusted.overlay.origin': 'y' } }], /trusted/],
      [[{ name: 'dev', type: 'character-device', devmajor: 1, devminor: 3 }], /device node/],
    ];
    for (const [entries, message] of refused) {
      const at = fs.mkdtempSync(path.join(work, 'refused-'));
      const err = await writeErofsLayerFromTar(streamOf(await layerTar(entries)), { metaPath: path.join(at, 'm'), blobPath: path.join(at, 'b'), chunkSizeBytes: LAYER_CHUNK_BYTES }, LIMITS, { upperDir: true }).catch((e: unknown) => e);
      expect((err as RollboxError).message).toMatch(message);
    }
  });

  it('refuses what the extractor refuses, leaving only files the caller removes', async () => {
    const cases: [TarEntry[], RegExp][] = [
      [[{ name: 'a', type: 'symlink', linkname: '../../etc' }], /points outside the layer/],
      [[{ name: 'l', type: 'symlink', linkname: '/x' }, { name: 'l/file', content: 'x' }], /passes through a symlink/],
      [[{ name: 'hl', type: 'link', linkname: 'missing' }], /does not name an earlier regular file/],
      [[{ name: 'dev', type: 'character-device', devmajor: 1, devminor: 3 }], /whiteout|device node/],
      [[{ name: 'x', content: 'x', pax: { 'SCHILY.xattr.trusted.overlay.opaque': 'y' } }], /trusted/],
    ];
    for (const [entries, message] of cases) {
      const dir = fs.mkdtempSync(path.join(work, 'refused-'));
      const files = { metaPath: path.join(dir, 'm'), blobPath: path.join(dir, 'b'), chunkSizeBytes: LAYER_CHUNK_BYTES };
      const err = await writeErofsLayerFromTar(streamOf(await layerTar(entries)), files, LIMITS, { imageLayer: true }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(RollboxError);
      expect((err as RollboxError).message).toMatch(message);
      expect(fs.existsSync(files.metaPath)).toBe(false);
    }
    const tooBig = fs.mkdtempSync(path.join(work, 'refused-'));
    const err = await writeErofsLayerFromTar(streamOf(await layerTar([{ name: 'f', content: randomBytes(5000) }])), { metaPath: path.join(tooBig, 'm'), blobPath: path.join(tooBig, 'b'), chunkSizeBytes: LAYER_CHUNK_BYTES }, { maxBytes: 4096, maxEntries: 10 }).catch((e: unknown) => e);
    expect((err as RollboxError).code).toBe('payload_too_large');
  });
});
