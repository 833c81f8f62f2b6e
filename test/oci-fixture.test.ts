/**
 * The image-archive builder of test/support/oci.ts checks itself: read back with tar-stream,
 * every blob hashes to its path, diff_ids are the uncompressed layers' digests, the JSON has
 * the shapes the OCI and Docker formats give it, and each corruption does what it says.
 * Pure Node: no root, no Redis, no runc.
 */
import { Readable } from 'node:stream';
import { gunzipSync } from 'node:zlib';
import { extract } from 'tar-stream';
import { describe, expect, it } from 'vitest';
import { blobPath, digestOf, dockerSave, layerTar, MEDIA_TYPES, ociImage, ociLayout, REF_NAME_ANNOTATION, sha256Hex, type ImageDef } from './support/oci.ts';

interface ReadEntry {
  name: string;
  type: string;
  linkname?: string | null;
  mode: number;
  uid: number;
  gid: number;
  mtime: Date;
  pax?: unknown;
  content: Buffer;
}

async function readTar(buf: Buffer): Promise<ReadEntry[]> {
  const entries: ReadEntry[] = [];
  for await (const entry of Readable.from([buf]).pipe(extract())) {
    const chunks: Buffer[] = [];
    for await (const c of entry) chunks.push(c as Buffer);
    const h = entry.header;
    entries.push({ name: h.name, type: h.type, linkname: h.linkname, mode: h.mode, uid: h.uid, gid: h.gid, mtime: h.mtime, pax: h.pax, content: Buffer.concat(chunks) });
  }
  return entries;
}

const files = (entries: ReadEntry[]) => new Map(entries.filter((e) => e.type === 'file').map((e) => [e.name, e.content]));
const json = (m: Map<string, Buffer>, name: string) => JSON.parse(m.get(name)!.toString('utf8'));

/** Every blobs/sha256/<hex> file hashes to <hex>. */
function expectBlobsIntact(m: Map<string, Buffer>): void {
  const blobs = [...m.keys()].filter((n) => n.startsWith('blobs/sha256/'));
  expect(blobs.length).toBeGreaterThan(0);
  for (const name of blobs) expect(sha256Hex(m.get(name)!), name).toBe(name.slice('blobs/sha256/'.length));
}

async function sampleImage(tag: string, extra: ImageDef['config'] = {}): Promise<ImageDef> {
  const base = await layerTar([
    { name: 'etc/', type: 'directory' },
    { name: 'etc/os-release', content: 'ID=test\n' },
    { name: 'bin/', type: 'directory' },
    { name: 'bin/tool', content: `#!/bin/sh\necho ${tag}\n`, mode: 0o755 },
    { name: 'bin/alias', type: 'symlink', linkname: 'tool' },
  ]);
  const upper = await layerTar([
    { name: 'etc/.wh.os-release', content: '' },
    { name: `app/${tag}.txt`, content: `hello from ${tag}\n`, uid: 1000, gid: 1000 },
  ]);
  return { layers: [base, upper], config: { Env: ['PATH=/bin', `IMAGE=${tag}`], WorkingDir: '/app', User: '1000:1000', Entrypoint: ['/bin/tool'], Cmd: ['--help'], ...extra } };
}

describe('layerTar', () => {
  it('writes every entry type, PAX records and mtime 0, deterministically', async () => {
    const entries = [
      { name: 'dir/', type: 'directory' as const, mode: 0o700 },
      { name: 'dir/file', content: 'data', uid: 7, gid: 8, pax: { 'SCHILY.xattr.user.note': 'hi' } },
      { name: 'dir/link', type: 'symlink' as const, linkname: 'file' },
      { name: 'dir/hard', type: 'link' as const, linkname: 'dir/file' },
      { name: 'dir/pipe', type: 'fifo' as const },
      { name: 'dir/null', type: 'character-device' as const, devmajor: 1, devminor: 3 },
      { name: 'dir/old', content: Buffer.from([1, 2, 3]), mtime: new Date(1_000_000_000_000) },
      { name: `dir/${'long-name-'.repeat(20)}`, content: 'x' },
    ];
    const tar = await layerTar(entries);
    expect((await layerTar(entries)).equals(tar)).toBe(true);
    const read = await readTar(tar);
    expect(read.map((e) => [e.name, e.type])).toEqual(entries.map((e) => [e.name, e.type ?? 'file']));
    const byName = new Map(read.map((e) => [e.name, e]));
    expect(byName.get('dir/file')!.pax).toMatchObject({ 'SCHILY.xattr.user.note': 'hi' });
    expect(byName.get('dir/file')!).toMatchObject({ uid: 7, gid: 8, content: Buffer.from('data') });
    expect(byName.get('dir/')!.mode & 0o7777).toBe(0o700);
    expect(byName.get('dir/link')!.linkname).toBe('file');
    expect(byName.get('dir/hard')!.linkname).toBe('dir/file');
    expect(byName.get('dir/file')!.mtime.getTime()).toBe(0);
    expect(byName.get('dir/old')!.mtime.getTime()).toBe(1_000_000_000_000);
    // The PAX header really is in the bytes (not only parsed back by the same library).
    expect(tar.includes(Buffer.from(' SCHILY.xattr.user.note=hi\n'))).toBe(true);
  });
});

describe('ociLayout', () => {
  it('one image, gzip: blobs before index.json, digests and diff_ids right, ref name annotated', async () => {
    const image = await sampleImage('one');
    const archive = await ociLayout([image], { gzip: true, refNames: ['one:1'] });
    const entries = await readTar(archive);
    const m = files(entries);
    expectBlobsIntact(m);
    expect(json(m, 'oci-layout')).toEqual({ imageLayoutVersion: '1.0.0' });
    const index = json(m, 'index.json');
    expect(index.schemaVersion).toBe(2);
    expect(index.manifests).toHaveLength(1);
    expect(index.manifests[0]).toMatchObject({ mediaType: MEDIA_TYPES.manifest, annotations: { [REF_NAME_ANNOTATION]: 'one:1' } });
    const manifestDigest: string = index.manifests[0].digest;
    const manifest = json(m, blobPath(manifestDigest));
    expect(m.get(blobPath(manifestDigest))!.length).toBe(index.manifests[0].size);
    expect(manifest.config.mediaType).toBe(MEDIA_TYPES.config);
    expect(manifest.layers.map((l: any) => l.mediaType)).toEqual([MEDIA_TYPES.layerGzip, MEDIA_TYPES.layerGzip]);
    const config = json(m, blobPath(manifest.config.digest));
    expect(config).toMatchObject({ os: 'linux', architecture: 'amd64', rootfs: { type: 'layers' } });
    expect(config.config).toEqual({ Env: ['PATH=/bin', 'IMAGE=one'], WorkingDir: '/app', User: '1000:1000', Entrypoint: ['/bin/tool'], Cmd: ['--help'] });
    expect(config.rootfs.diff_ids).toEqual(image.layers.map(digestOf));
    manifest.layers.forEach((l: any, i: number) => {
      const blob = m.get(blobPath(l.digest))!;
      expect(blob.length).toBe(l.size);
      expect(gunzipSync(blob).equals(image.layers[i]!)).toBe(true);
    });
    // Order: directories, layers, config, manifest, then index.json and oci-layout.
    const names = entries.map((e) => e.name);
    expect(names).toEqual(['blobs/', 'blobs/sha256/', ...manifest.layers.map((l: any) => blobPath(l.digest)), blobPath(manifest.config.digest), blobPath(manifestDigest), 'index.json', 'oci-layout']);
    // What a test checks an import against.
    expect(ociImage(image, { gzip: true }).manifest.descriptor.digest).toBe(manifestDigest);
  });

  it('uncompressed layers by default; a layer the image repeats is stored once', async () => {
    const image = await sampleImage('dup');
    const twice: ImageDef = { ...image, layers: [image.layers[0]!, image.layers[1]!, image.layers[0]!] };
    const m = files(await readTar(await ociLayout([twice])));
    expectBlobsIntact(m);
    const manifest = json(m, blobPath(json(m, 'index.json').manifests[0].digest));
    expect(manifest.layers.map((l: any) => l.mediaType)).toEqual([MEDIA_TYPES.layer, MEDIA_TYPES.layer, MEDIA_TYPES.layer]);
    expect(manifest.layers[0].digest).toBe(manifest.layers[2].digest);
    expect([...m.keys()].filter((n) => n.startsWith('blobs/'))).toHaveLength(4); // 2 layers + config + manifest
  });

  it('nested: one image index whose manifests carry their platforms', async () => {
    const amd = { ...(await sampleImage('amd')), os: 'linux', architecture: 'amd64' };
    const arm = { ...(await sampleImage('arm')), os: 'linux', architecture: 'arm64', variant: 'v8' };
    const m = files(await readTar(await ociLayout([amd, arm], { index: 'nested', gzip: true, refNames: ['multi:latest'] })));
    expectBlobsIntact(m);
    const index = json(m, 'index.json');
    expect(index.manifests).toHaveLength(1);
    expect(index.manifests[0]).toMatchObject({ mediaType: MEDIA_TYPES.index, annotations: { [REF_NAME_ANNOTATION]: 'multi:latest' } });
    const nested = json(m, blobPath(index.manifests[0].digest));
    expect(nested.mediaType).toBe(MEDIA_TYPES.index);
    expect(nested.manifests.map((d: any) => d.platform)).toEqual([
      { os: 'linux', architecture: 'amd64' },
      { os: 'linux', architecture: 'arm64', variant: 'v8' },
    ]);
    const armConfig = json(m, blobPath(json(m, blobPath(nested.manifests[1].digest)).config.digest));
    expect(armConfig).toMatchObject({ architecture: 'arm64', variant: 'v8', config: { Env: ['PATH=/bin', 'IMAGE=arm'] } });
  });

  it('flat with several images: index.json lists each manifest with its ref name', async () => {
    const a = await sampleImage('a');
    const b = await sampleImage('b');
    const m = files(await readTar(await ociLayout([a, b], { refNames: ['a:1', 'b:2'] })));
    expectBlobsIntact(m);
    const index = json(m, 'index.json');
    expect(index.manifests.map((d: any) => [d.mediaType, d.annotations[REF_NAME_ANNOTATION]])).toEqual([
      [MEDIA_TYPES.manifest, 'a:1'],
      [MEDIA_TYPES.manifest, 'b:2'],
    ]);
    for (const [i, image] of [a, b].entries()) {
      const manifest = json(m, blobPath(index.manifests[i].digest));
      expect(json(m, blobPath(manifest.config.digest)).rootfs.diff_ids).toEqual(image.layers.map(digestOf));
    }
  });
});

describe('dockerSave', () => {
  it('legacy: layer directories, then the config, then manifest.json and repositories', async () => {
    const image = await sampleImage('legacy');
    const entries = await readTar(await dockerSave(image, { tag: 'legacy:v1' }));
    const m = files(entries);
    const manifest = json(m, 'manifest.json');
    expect(manifest).toHaveLength(1);
    expect(manifest[0].RepoTags).toEqual(['legacy:v1']);
    const { Config, Layers } = manifest[0];
    expect(Config).toMatch(/^[0-9a-f]{64}\.json$/);
    expect(sha256Hex(m.get(Config)!)).toBe(Config.slice(0, 64));
    expect(Layers).toHaveLength(2);
    for (const p of Layers) expect(p).toMatch(/^[0-9a-f]{64}\/layer\.tar$/);
    expect(json(m, Config).rootfs.diff_ids).toEqual(Layers.map((p: string) => digestOf(m.get(p)!)));
    expect(Layers.map((p: string) => m.get(p))).toEqual(image.layers);
    const [id0, id1] = Layers.map((p: string) => p.split('/')[0]);
    expect(m.get(`${id0}/VERSION`)!.toString()).toBe('1.0');
    expect(json(m, `${id1}/json`)).toMatchObject({ id: id1, parent: id0 });
    expect(json(m, 'repositories')).toEqual({ legacy: { v1: id1 } });
    expect(entries.map((e) => e.name)).toEqual([
      ...[id0, id1].flatMap((id) => [`${id}/`, `${id}/VERSION`, `${id}/json`, `${id}/layer.tar`]),
      Config,
      'manifest.json',
      'repositories',
    ]);
  });

  it('legacy: a repeated layer is stored once, the later layer.tar a symlink to it', async () => {
    const image = await sampleImage('rep');
    const entries = await readTar(await dockerSave({ ...image, layers: [image.layers[0]!, image.layers[1]!, image.layers[0]!] }));
    const m = files(entries);
    const Layers: string[] = json(m, 'manifest.json')[0].Layers;
    expect(new Set(Layers).size).toBe(3);
    const last = entries.find((e) => e.name === Layers[2])!;
    expect(last.type).toBe('symlink');
    expect(last.linkname).toBe(`../${Layers[0]}`);
    expect(entries.filter((e) => e.name.endsWith('/layer.tar') && e.type === 'file')).toHaveLength(2);
  });

  it('oci (Docker 25+): an OCI layout plus manifest.json naming blob paths', async () => {
    const image = await sampleImage('new');
    const doubled: ImageDef = { ...image, layers: [...image.layers, image.layers[0]!] };
    const entries = await readTar(await dockerSave(doubled, { format: 'oci', tag: 'example.com/team/new:2' }));
    const m = files(entries);
    expectBlobsIntact(m);
    expect(json(m, 'oci-layout')).toEqual({ imageLayoutVersion: '1.0.0' });
    const index = json(m, 'index.json');
    expect(index.manifests[0].annotations).toEqual({ 'io.containerd.image.name': 'example.com/team/new:2', [REF_NAME_ANNOTATION]: '2' });
    const [entry] = json(m, 'manifest.json');
    expect(entry.RepoTags).toEqual(['example.com/team/new:2']);
    expect(entry.Config).toMatch(/^blobs\/sha256\/[0-9a-f]{64}$/);
    const manifest = json(m, blobPath(index.manifests[0].digest));
    expect(entry.Config).toBe(blobPath(manifest.config.digest));
    expect(entry.Layers).toEqual(manifest.layers.map((l: any) => blobPath(l.digest)));
    expect(entry.Layers[0]).toBe(entry.Layers[2]);
    expect(entries.filter((e) => e.type === 'file' && e.name.startsWith('blobs/sha256/'))).toHaveLength(4);
    expect(json(m, entry.Config).rootfs.diff_ids).toEqual(doubled.layers.map(digestOf));
    expect(json(m, 'repositories')).toEqual({ 'example.com/team/new': { '2': index.manifests[0].digest.slice(7) } });
    const names = entries.map((e) => e.name);
    expect(names.indexOf('index.json')).toBeGreaterThan(Math.max(...names.map((n, i) => (n.startsWith('blobs/') ? i : -1))));
  });

  it('untagged: RepoTags null and no repositories', async () => {
    const m = files(await readTar(await dockerSave(await sampleImage('untagged'), { tag: null })));
    expect(json(m, 'manifest.json')[0].RepoTags).toBeNull();
    expect(m.has('repositories')).toBe(false);
  });
});

describe('corruption', () => {
  it('missing-blob leaves one layer blob out (and only it)', async () => {
    const image = await sampleImage('missing');
    const oci = ociImage(image, { gzip: true });
    const m = files(await readTar(await ociLayout([image], { gzip: true, corrupt: { kind: 'missing-blob' } })));
    expect(m.has(blobPath(oci.layers[0]!.descriptor.digest))).toBe(false);
    expect(m.has(blobPath(oci.layers[1]!.descriptor.digest))).toBe(true);
    expect(m.has(blobPath(oci.manifest.descriptor.digest))).toBe(true);

    const top = files(await readTar(await ociLayout([image], { corrupt: { kind: 'missing-blob', layer: 1 } })));
    expect(top.has(blobPath(ociImage(image).layers[1]!.descriptor.digest))).toBe(false);

    const legacy = files(await readTar(await dockerSave(image, { corrupt: { kind: 'missing-blob' } })));
    const Layers: string[] = json(legacy, 'manifest.json')[0].Layers;
    expect(legacy.has(Layers[0]!)).toBe(false);
    expect(legacy.has(Layers[1]!)).toBe(true);
    expect(legacy.has(`${Layers[0]!.split('/')[0]}/json`)).toBe(true);

    const docker25 = files(await readTar(await dockerSave(image, { format: 'oci', corrupt: { kind: 'missing-blob' } })));
    expect(docker25.has(json(docker25, 'manifest.json')[0].Layers[0])).toBe(false);
  });

  it('digest-mismatch: the blob keeps its name but not its hash', async () => {
    const image = await sampleImage('mismatch');
    // gzip: only the blob digest tells (the blob still decompresses to the same layer).
    const gz = ociImage(image, { gzip: true }).layers[0]!;
    const m = files(await readTar(await ociLayout([image], { gzip: true, corrupt: { kind: 'digest-mismatch' } })));
    const blob = m.get(blobPath(gz.descriptor.digest))!;
    expect(digestOf(blob)).not.toBe(gz.descriptor.digest);
    expect(blob.length).toBe(gz.descriptor.size);
    expect(gunzipSync(blob).equals(image.layers[0]!)).toBe(true);
    // Uncompressed: one byte of file data changed, the tar still reads.
    const plain = ociImage(image).layers[0]!;
    const p = files(await readTar(await ociLayout([image], { corrupt: { kind: 'digest-mismatch' } })));
    const changed = p.get(blobPath(plain.descriptor.digest))!;
    expect(digestOf(changed)).not.toBe(plain.descriptor.digest);
    expect([...changed].filter((b, i) => b !== image.layers[0]![i])).toHaveLength(1);
    expect((await readTar(changed)).map((e) => e.name)).toEqual((await readTar(image.layers[0]!)).map((e) => e.name));
    // Legacy docker save: layer.tar no longer matches the config's diff_id.
    const legacy = files(await readTar(await dockerSave(image, { corrupt: { kind: 'digest-mismatch' } })));
    const [entry] = json(legacy, 'manifest.json');
    const diffIds: string[] = json(legacy, entry.Config).rootfs.diff_ids;
    expect(diffIds).toEqual(image.layers.map(digestOf));
    expect(digestOf(legacy.get(entry.Layers[0])!)).not.toBe(diffIds[0]);
    expect(digestOf(legacy.get(entry.Layers[1])!)).toBe(diffIds[1]);
  });

  it('digest-mismatch on a layer with no file data changes a header and keeps the tar valid', async () => {
    const dirsOnly = await layerTar([{ name: 'a/', type: 'directory' }, { name: 'a/b', type: 'symlink', linkname: 'x' }]);
    const image: ImageDef = { layers: [dirsOnly] };
    const m = files(await readTar(await ociLayout([image], { corrupt: { kind: 'digest-mismatch' } })));
    const digest = ociImage(image).layers[0]!.descriptor.digest;
    const changed = m.get(blobPath(digest))!;
    expect(digestOf(changed)).not.toBe(digest);
    expect((await readTar(changed)).map((e) => e.name)).toEqual(['a/', 'a/b']);
  });

  it('truncate cuts the archive and a reader fails on it', async () => {
    const image = await sampleImage('cut');
    const whole = await ociLayout([image], { gzip: true });
    const cut = await ociLayout([image], { gzip: true, corrupt: { kind: 'truncate', bytes: 1500 } });
    expect(cut.length).toBe(1500);
    expect(cut.equals(whole.subarray(0, 1500))).toBe(true);
    await expect(readTar(cut)).rejects.toThrow();
    expect((await dockerSave(image, { corrupt: { kind: 'truncate', bytes: 10_000 } })).length).toBe(10_000);
  });
});
