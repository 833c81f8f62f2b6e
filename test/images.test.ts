import fs from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ExecResult, Image, ImportedImage, Layer } from '../src/api/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { FIXTURE_CONFIG, busyboxEntries, checkFixtureView, imageFixtureLayers, upperLayer } from './support/image-fixture.ts';
import { digestOf, dockerSave, layerTar, ociLayout, type Corruption, type ImageDef } from './support/oci.ts';

/**
 * Images built here as OCI layouts and `docker save` archives, imported over HTTP, and
 * every property they carry checked from inside a sandbox made from them.
 */

let cluster: TestCluster;
let token: string;
let base: Buffer;
const made: string[] = [];

beforeAll(async () => {
  // app-a is in the cloud pool's pre-synced set by name: all its layers are.
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-img' }], env: { ROLLBOX_BURST_SYNC_LAYERS: 'busybox,app-a', ROLLBOX_BURST_TICK_MS: '200' } });
  token = await cluster.token('images', ['sandbox:run', 'layer:write', 'sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:snapshot']);
  ({ base } = await imageFixtureLayers());
});
afterAll(async () => {
  for (const id of made) await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`).catch(() => undefined);
  await cluster?.stop();
});

const upper = upperLayer;
const CONFIG = FIXTURE_CONFIG;

async function importArchive(name: string, archive: Buffer, query = ''): Promise<{ status: number; body: ImportedImage & { error?: { code: string; message: string } } }> {
  return api(cluster, token, 'POST', `/v1/images?name=${name}${query}`, new Uint8Array(archive), { 'content-type': 'application/x-tar' });
}

async function sandbox(body: object): Promise<string> {
  const created = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64, diskMiB: 64 }, ...body });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  made.push(created.body.id);
  return created.body.id;
}

async function sh(id: string, cmd: string, extra: object = {}): Promise<ExecResult> {
  const r = await api<ExecResult>(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, ...extra });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return r.body;
}
async function out(id: string, cmd: string, extra: object = {}): Promise<string> {
  const r = await sh(id, cmd, extra);
  expect(r.exitCode, `${cmd}: ${r.stderr}`).toBe(0);
  return r.stdout.trim();
}

/** The layers in the store (a split layer is three files: chunk table, meta, blob). */
async function storeFiles(): Promise<string[]> {
  const names = await fs.readdir(path.join(cluster.rootDir, 'layers', 'sha256')).catch(() => [] as string[]);
  return [...new Set(names.map((n) => n.slice(0, 64)))].sort();
}

describe('image import', () => {
  let imageA: ImportedImage;

  it('imports an OCI layout and carries whiteouts, opaque dirs, links, modes, owners, xattrs and FIFOs into a sandbox', async () => {
    const def: ImageDef = { layers: [base, await upper()], config: CONFIG };
    const r = await importArchive('app-a', await ociLayout([def], { gzip: true }));
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    imageA = r.body;
    expect(imageA).toMatchObject({ name: 'app-a', platform: 'linux/amd64', config: { Env: CONFIG.Env, WorkingDir: '/srv/app', User: 'app', Cmd: ['/bin/sh'] }, import: { layersBuilt: 2, layersReused: 0 } });
    expect(imageA.layers).toHaveLength(2);

    const id = await sandbox({ image: { base: 'app-a' } });
    await checkFixtureView((cmd, extra) => sh(id, cmd, extra));
    // The request's env and workdir override the image's; an exec's user overrides the image's.
    const other = await sandbox({ image: { base: 'app-a' }, env: { GREETING: 'from the request' }, workdir: '/tmp' });
    expect(await out(other, 'echo "$GREETING"; pwd; echo $PATH')).toBe('from the request\n/tmp\n/usr/bin:/bin');
    expect(await out(other, 'id -u', { user: '0' })).toBe('0');
    // The function-call tier runs as the image's user too, with its env.
    const run = await api(cluster, token, 'POST', '/v1/run', { image: { base: 'app-a' }, cmd: 'id -u; echo "$GREETING"', resources: { memoryMiB: 64, diskMiB: 64 } });
    expect(run.body, JSON.stringify(run.body)).toMatchObject({ status: 'ok', stdout: '1000\nhello from the image\n' });
  });

  it('stores a layer shared by two images once and does not build it again', async () => {
    const upperB = await layerTar([{ name: 'etc/motd', content: 'image b\n' }]);
    const before = await storeFiles();
    const r = await importArchive('app-b', await ociLayout([{ layers: [base, upperB], config: { Env: ['PATH=/bin'] } }], { gzip: false }));
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    // Uncompressed here, gzip in app-a: the same content (diff_id) is the same layer.
    expect(r.body.import).toMatchObject({ layersBuilt: 1, layersReused: 1 });
    expect(r.body.layers[0]).toEqual(imageA.layers[0]);
    expect((await storeFiles()).length).toBe(before.length + 1);
    const id = await sandbox({ image: { base: 'app-b' } });
    expect(await out(id, 'cat /etc/motd; id -u; pwd')).toBe('image b\n0\n/');

    // The same image again as a docker save archive (older format, named by layer id): nothing built.
    const again = await importArchive('app-b-docker', await dockerSave({ layers: [base, upperB], config: { Env: ['PATH=/bin'] } }, { tag: 'app:b' }));
    expect(again.status, JSON.stringify(again.body)).toBe(201);
    expect(again.body.import).toMatchObject({ layersBuilt: 0, layersReused: 2 });
    expect(again.body.layers.map((l) => l.digest)).toEqual(r.body.layers.map((l) => l.digest));
    // Docker 25+'s archive: an OCI layout with a manifest.json beside it.
    const oci = await importArchive('app-a-docker25', await dockerSave({ layers: [base, await upper()], config: CONFIG }, { format: 'oci' }));
    expect(oci.status, JSON.stringify(oci.body)).toBe(201);
    expect(oci.body.layers.map((l) => l.digest)).toEqual(imageA.layers.map((l) => l.digest));
  });

  it('picks linux/amd64 from a multi-platform index, or the platform asked', async () => {
    const arm = await layerTar([...busyboxEntries(), { name: 'arch', content: 'arm64\n' }]);
    const amd = await layerTar([...busyboxEntries(), { name: 'arch', content: 'amd64\n' }]);
    const archive = await ociLayout(
      [
        { layers: [arm], os: 'linux', architecture: 'arm64', variant: 'v8' },
        { layers: [amd], os: 'linux', architecture: 'amd64' },
      ],
      { index: 'nested', refNames: ['multi:1'] },
    );
    const before = await storeFiles();
    const picked = await importArchive('multi', archive);
    expect(picked.status, JSON.stringify(picked.body)).toBe(201);
    expect(picked.body.platform).toBe('linux/amd64');
    // The other platform's layer was read but is not kept.
    expect((await storeFiles()).length).toBe(before.length + 1);
    expect(await out(await sandbox({ image: { base: 'multi' } }), 'cat /arch')).toBe('amd64');
    const armImage = await importArchive('multi-arm', archive, '&platform=linux/arm64');
    expect(armImage.status, JSON.stringify(armImage.body)).toBe(201);
    expect(armImage.body.platform).toBe('linux/arm64/v8');
    const none = await importArchive('multi-s390', archive, '&platform=linux/s390x');
    expect(none.status).toBe(400);
    expect(none.body.error).toMatchObject({ code: 'invalid_image' });
    expect(none.body.error!.message).toMatch(/linux\/arm64\/v8, linux\/amd64/);
  });

  it('takes one image of several by ref (an OCI ref name, a Docker tag)', async () => {
    const [one, two] = await Promise.all(['one', 'two'].map((w) => layerTar([{ name: 'which', content: `${w}\n` }])));
    const archive = await ociLayout([{ layers: [one!] }, { layers: [two!] }], { index: 'flat', refNames: ['tools:1', 'tools:2'] });
    const ambiguous = await importArchive('tools', archive);
    expect(ambiguous.status).toBe(400);
    expect(ambiguous.body.error!.message).toMatch(/2 images \(tools:1, tools:2\): choose one with ref=/);
    const picked = await importArchive('tools-2', archive, '&ref=tools:2');
    expect(picked.status, JSON.stringify(picked.body)).toBe(201);
    expect(picked.body.layers.map((l) => l.diffId)).toEqual([digestOf(two!)]);
    // Docker 25+ names it docker.io/library/app:7 in index.json; the short tag finds it.
    const docker25 = await importArchive('app-7', await dockerSave({ layers: [one!] }, { format: 'oci', tag: 'app:7' }), '&ref=app:7');
    expect(docker25.status, JSON.stringify(docker25.body)).toBe(201);
    expect((await importArchive('app-8', await dockerSave({ layers: [one!] }, { tag: 'app:7' }), '&ref=app:8')).status).toBe(400);
  });

  it('lists, reads and deletes image records; layers stay while an image uses them', async () => {
    const list = await api<{ images: Image[] }>(cluster, token, 'GET', '/v1/images');
    expect(list.body.images.map((i) => i.name)).toEqual(expect.arrayContaining(['app-a', 'app-b', 'app-b-docker', 'multi']));
    const one = await waitFor('app-a synced for burst', async () => {
      const r = await api<Image>(cluster, token, 'GET', '/v1/images/app-a');
      return r.body.synced ? r : undefined;
    });
    expect(one.body).toMatchObject({ name: 'app-a', digest: imageA.digest, layers: imageA.layers, config: imageA.config, synced: true });
    expect((await api(cluster, token, 'GET', '/v1/burst')).body.syncedLayers).toEqual(expect.arrayContaining(imageA.layers.map((l) => l.digest)));
    // app-b shares app-a's base, but its own upper layer is not in the set.
    expect((await api<Image>(cluster, token, 'GET', '/v1/images/app-b')).body.synced).toBe(false);
    expect(one.body.sizeBytes).toBe(imageA.layers.reduce((s, l) => s + l.sizeBytes, 0));
    const deleted = await api(cluster, token, 'DELETE', '/v1/images/app-b-docker');
    expect(deleted.status).toBe(200);
    expect((await api(cluster, token, 'GET', '/v1/images/app-b-docker')).status).toBe(404);
    expect((await api(cluster, token, 'POST', '/v1/sandboxes', { image: { base: 'app-b-docker' } })).body.error).toMatchObject({ code: 'not_found' });
    // Its layers are app-b's too: still registered.
    for (const l of imageA.layers) expect((await api<Layer>(cluster, token, 'GET', `/v1/layers/${l.digest}`)).status).toBe(200);
    // A layer's name is not an image's.
    const clash = await importArchive('busybox', await ociLayout([{ layers: [base] }]));
    expect(clash.status).toBe(409);
  });

  it('works with extra layers, hidden paths, snapshots and hibernation', async () => {
    const extra = await api<Layer>(cluster, token, 'POST', '/v1/layers', new Uint8Array(await layerTar([{ name: 'srv/app/', type: 'directory', uid: 1000, gid: 1000 }, { name: 'srv/app/answer', content: '42\n', uid: 1000, gid: 1000 }])), { 'content-type': 'application/x-tar' });
    expect(extra.status).toBe(201);
    const id = await sandbox({ image: { base: 'app-a', layers: [extra.body.digest] }, hiddenPaths: ['/srv/app/answer'] });
    expect(await out(id, 'cat /srv/app/answer')).toBe(''); // masked: reads as /dev/null
    await out(id, 'echo work > /srv/app/progress');
    const snap = await api<Layer>(cluster, token, 'POST', `/v1/sandboxes/${id}/snapshot`, {});
    expect(snap.status, JSON.stringify(snap.body)).toBe(201);
    expect(snap.body.parents).toEqual([...imageA.layers.map((l) => l.digest), extra.body.digest]);
    const fromSnap = await sandbox({ image: { base: 'app-a', layers: [extra.body.digest, snap.body.digest] } });
    expect(await out(fromSnap, 'cat /srv/app/progress /srv/app/answer; ls /data; id -u')).toBe('work\n42\nc\n1000');

    const paused = await api(cluster, token, 'POST', `/v1/sandboxes/${fromSnap}/pause`, { mode: 'hibernate' });
    expect(paused.status, JSON.stringify(paused.body)).toBe(200);
    const resumed = await api(cluster, token, 'POST', `/v1/sandboxes/${fromSnap}/resume`, {});
    expect(resumed.status, JSON.stringify(resumed.body)).toBe(200);
    expect(await out(fromSnap, 'cat /srv/app/progress; ls /data; test -e /etc/motd || echo gone')).toBe('work\nc\ngone');
  });
});

describe('image import refuses bad archives and leaves nothing behind', () => {
  const deep = async (n: number): Promise<Buffer> => ociLayout([{ layers: await Promise.all(Array.from({ length: n }, (_, i) => layerTar([{ name: `l${i}`, content: `${i}\n` }]))) }]);
  const cases: [string, () => Promise<Buffer>, RegExp, string][] = [
    ['a manifest naming a missing blob', async () => ociLayout([{ layers: [await layerTar([{ name: 'x', content: 'missing\n' }])] }], { corrupt: { kind: 'missing-blob' } satisfies Corruption }), /not in the archive/, 'invalid_image'],
    ['a blob whose bytes do not match its digest', async () => ociLayout([{ layers: [await layerTar([{ name: 'x', content: 'mismatch\n' }])] }], { gzip: true, corrupt: { kind: 'digest-mismatch' } }), /hash to/, 'invalid_image'],
    ['a docker save layer whose content does not match its diff_id', async () => dockerSave({ layers: [await layerTar([{ name: 'x', content: 'changed\n' }])] }, { corrupt: { kind: 'digest-mismatch' } }), /hashes to .* the image config says/, 'invalid_image'],
    ['a truncated archive', async () => ociLayout([{ layers: [await layerTar([{ name: 'x', content: 'y'.repeat(50_000) }])] }], { corrupt: { kind: 'truncate', bytes: 20_000 } }), /./, 'invalid_'],
    ['a layer with ../', async () => ociLayout([{ layers: [await layerTar([{ name: '../../escaped-by-image-test', content: 'out\n' }])] }]), /'\.\.'/, 'invalid_layer'],
    ['a layer with a device node', async () => ociLayout([{ layers: [await layerTar([{ name: 'dev/null', type: 'character-device', devmajor: 1, devminor: 3 }])] }]), /device node "dev\/null"/, 'invalid_layer'],
    ['a layer whose symlink climbs out', async () => ociLayout([{ layers: [await layerTar([{ name: 'a/link', type: 'symlink', linkname: '../../../etc' }])] }]), /points outside/, 'invalid_layer'],
    ['a layer forging overlay xattrs', async () => ociLayout([{ layers: [await layerTar([{ name: 'd/', type: 'directory', pax: { 'SCHILY.xattr.trusted.overlay.redirect': '/etc' } }])] }]), /trusted/, 'invalid_layer'],
    ['a 50-deep layer stack', () => deep(50), /50 layers; a sandbox stacks at most 40/, 'invalid_image'],
    ['not a tar at all', async () => Buffer.from('{"hello": "world"}'.repeat(100)), /./, 'invalid_image'],
  ];
  for (const [what, build, message, code] of cases) {
    it(`refuses ${what}`, async () => {
      const before = await storeFiles();
      const layersBefore = (await api<{ layers: Layer[] }>(cluster, token, 'GET', '/v1/layers')).body.layers.length;
      const r = await importArchive('bad', await build());
      expect(r.status, JSON.stringify(r.body)).toBeGreaterThanOrEqual(400);
      expect(r.status, JSON.stringify(r.body)).toBeLessThan(500);
      expect(r.body.error?.code).toContain(code);
      expect(r.body.error?.message).toMatch(message);
      expect(await storeFiles()).toEqual(before);
      expect((await api<{ layers: Layer[] }>(cluster, token, 'GET', '/v1/layers')).body.layers.length).toBe(layersBefore);
      expect((await api(cluster, token, 'GET', '/v1/images/bad')).status).toBe(404);
      // Nothing outside the store: no leftover extraction dirs, nothing escaped.
      expect((await fs.readdir(path.join(cluster.rootDir, 'gateway', 'tmp')).catch(() => [])).filter((n) => n.startsWith('image-layer-'))).toEqual([]);
      expect(await fs.stat(path.join(cluster.rootDir, 'gateway', 'escaped-by-image-test')).catch(() => undefined)).toBeUndefined();
    });
  }

  it('refuses a create whose image and extra layers stack too deep', async () => {
    const ten = await importArchive('ten', await deep(10));
    expect(ten.status, JSON.stringify(ten.body)).toBe(201);
    const extras = await Promise.all(
      Array.from({ length: 31 }, async (_, i) => (await api<Layer>(cluster, token, 'POST', '/v1/layers', new Uint8Array(await layerTar([{ name: `e${i}`, content: `${i}\n` }])), { 'content-type': 'application/x-tar' })).body.digest),
    );
    const r = await api(cluster, token, 'POST', '/v1/sandboxes', { image: { base: 'ten', layers: extras } });
    expect(r.status).toBe(400);
    expect(r.body.error).toMatchObject({ code: 'invalid_request' });
    expect(r.body.error.message).toMatch(/41 layers \(image ten has 10\); a sandbox stacks at most 40/);
  });
});
