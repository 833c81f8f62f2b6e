import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ExecResult, Image, ImportedImage, Layer } from '../src/api/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { digestOf, dockerSave, layerTar, ociLayout, type Corruption, type ImageDef, type TarEntry } from './support/oci.ts';

/**
 * Images built here as OCI layouts and `docker save` archives, imported over HTTP, and
 * every property they carry checked from inside a sandbox made from them.
 */

const PASSWD = 'root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:App:/home/app:/bin/sh\n';
const GROUP = 'root:x:0:\napp:x:1000:\n';
/** cap_net_raw=ep as the kernel stores it (VFS_CAP_REVISION_2). */
const CAP_NET_RAW = Buffer.from('0100000200200000000000000000000000000000', 'hex');

let cluster: TestCluster;
let token: string;
let base: Buffer;
let probeDir: string;
const made: string[] = [];

/** A static getxattr probe: busybox has no getfattr. Prints the value in hex, or the errno's name. */
const PROBE_C = `#include <stdio.h>
#include <sys/xattr.h>
int main(int argc, char **argv) {
  unsigned char buf[4096];
  ssize_t n = lgetxattr(argv[1], argv[2], buf, sizeof buf);
  if (n < 0) { perror("getxattr"); return 1; }
  for (ssize_t i = 0; i < n; i++) printf("%02x", buf[i]);
  printf("\\n");
  return 0;
}
`;

function busyboxEntries(): TarEntry[] {
  const applets = ['sh', 'ls', 'cat', 'id', 'stat', 'echo', 'pwd', 'test', 'touch', 'mkfifo', 'readlink', 'env', 'sleep', 'true'];
  return [
    { name: 'bin/', type: 'directory' },
    { name: 'bin/busybox', content: readFileSync('/bin/busybox'), mode: 0o755 },
    ...applets.map((a): TarEntry => ({ name: `bin/${a}`, type: 'symlink', linkname: 'busybox' })),
  ];
}

beforeAll(async () => {
  // app-a is in the cloud pool's pre-synced set by name: all its layers are.
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-img' }], env: { ROLLBOX_BURST_SYNC_LAYERS: 'busybox,app-a', ROLLBOX_BURST_TICK_MS: '200' } });
  token = await cluster.token('images', ['sandbox:run', 'layer:write', 'sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:snapshot']);
  probeDir = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-xattr-probe-'));
  await fs.writeFile(path.join(probeDir, 'probe.c'), PROBE_C);
  execFileSync('musl-gcc', ['-static', '-O2', '-o', path.join(probeDir, 'getxattr'), path.join(probeDir, 'probe.c')]);
  base = await layerTar([
    ...busyboxEntries(),
    { name: 'bin/getxattr', content: await fs.readFile(path.join(probeDir, 'getxattr')), mode: 0o755 },
    { name: 'etc/', type: 'directory' },
    { name: 'etc/passwd', content: PASSWD },
    { name: 'etc/group', content: GROUP },
    { name: 'etc/motd', content: 'welcome\n' },
    { name: 'data/', type: 'directory' },
    { name: 'data/a', content: 'a\n' },
    { name: 'data/b', content: 'b\n' },
    { name: 'opt/tool/', type: 'directory' },
    { name: 'opt/tool/old', content: 'old\n' },
    { name: 'home/app/', type: 'directory', uid: 1000, gid: 1000, mode: 0o750 },
    { name: 'home/app/notes', content: 'mine\n', uid: 1000, gid: 1000, mode: 0o600 },
    { name: 'srv/app/', type: 'directory', uid: 1000, gid: 1000 },
  ]);
});
afterAll(async () => {
  for (const id of made) await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`).catch(() => undefined);
  await cluster?.stop();
  if (probeDir) await fs.rm(probeDir, { recursive: true, force: true });
});

async function upper(): Promise<Buffer> {
  return layerTar([
    { name: 'etc/.wh.motd', content: '' },
    { name: 'data/.wh..wh..opq', content: '' },
    { name: 'data/c', content: 'c\n' },
    { name: 'opt/.wh.tool', content: '' },
    { name: 'opt/tool', content: 'now a file\n' },
    { name: 'usr/bin/', type: 'directory' },
    { name: 'usr/bin/tool', content: '#!/bin/sh\necho tool\n', mode: 0o755 },
    { name: 'usr/bin/tool-again', type: 'link', linkname: 'usr/bin/tool' },
    { name: 'usr/bin/elevate', content: 'x', mode: 0o4755 },
    { name: 'usr/bin/pinger', content: 'x', mode: 0o755, pax: { 'LIBARCHIVE.xattr.security.capability': CAP_NET_RAW.toString('base64') } },
    { name: 'usr/bin/noted', content: 'x', pax: { 'SCHILY.xattr.user.note': 'hello' } },
    { name: 'usr/bin/sh-link', type: 'symlink', linkname: '../../bin/busybox' },
    { name: 'run/', type: 'directory' },
    { name: 'run/pipe', type: 'fifo', mode: 0o640, uid: 1000, gid: 1000 },
  ]);
}

const CONFIG = { Env: ['PATH=/usr/bin:/bin', 'GREETING=hello from the image'], WorkingDir: '/srv/app', User: 'app', Cmd: ['/bin/sh'] };

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

async function storeFiles(): Promise<string[]> {
  return (await fs.readdir(path.join(cluster.rootDir, 'layers', 'sha256')).catch(() => [] as string[])).sort();
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
    // The config's defaults: env, working directory, user.
    expect(await out(id, 'echo "$GREETING"; pwd; id -u; id -g; echo $HOME')).toBe('hello from the image\n/srv/app\n1000\n1000\n/home/app');
    // Whiteout: gone; opaque: only the upper layer's entries; a directory replaced by a file.
    expect((await sh(id, 'cat /etc/motd')).exitCode).not.toBe(0);
    expect(await out(id, 'ls /data')).toBe('c');
    expect(await out(id, 'cat /opt/tool')).toBe('now a file');
    // Hard link, setuid, symlink, owner, FIFO.
    expect(await out(id, 'stat -c "%i %h" /usr/bin/tool; stat -c "%i %h" /usr/bin/tool-again')).toMatch(/^(\d+) 2\n\1 2$/);
    expect(await out(id, 'stat -c %a /usr/bin/elevate')).toBe('4755');
    expect(await out(id, 'readlink /usr/bin/sh-link')).toBe('../../bin/busybox');
    expect(await out(id, 'stat -c "%u:%g %a %F" /home/app/notes /run/pipe')).toBe('1000:1000 600 regular file\n1000:1000 640 fifo');
    expect(await out(id, 'cat /home/app/notes')).toBe('mine');
    // xattrs, read with the sandbox's own probe (as root: security.* needs no privilege to read, but be plain).
    expect(await out(id, 'getxattr /usr/bin/pinger security.capability', { user: '0' })).toBe(CAP_NET_RAW.toString('hex'));
    expect(await out(id, 'getxattr /usr/bin/noted user.note')).toBe(Buffer.from('hello').toString('hex'));
    // The overlay's own marks are not visible as files or xattrs.
    expect((await sh(id, 'getxattr /data trusted.overlay.opaque', { user: '0' })).exitCode).not.toBe(0);
    expect(await out(id, 'ls -a /etc')).not.toMatch(/\.wh\./);
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
