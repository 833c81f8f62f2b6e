import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ExecResult, ImageRecord } from '../src/api/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { FIXTURE_CONFIG, busyboxEntries, checkFixtureView, imageFixtureLayers } from './support/image-fixture.ts';
import { layerTar, ociImage, ociLayout, type ImageDef } from './support/oci.ts';
import { pullEnded, pulled, startPull } from './support/pulls.ts';
import { startRegistryProxy, startTestRegistry, type RegistryProxy, type TestRegistry } from './support/registry.ts';

/**
 * Pulls from a real registry (Debian's docker-registry on loopback, images pushed with
 * skopeo) into a real cluster: the same layers and sandbox view as an import of the same
 * archive, a multi-platform index, work done once (two pulls at once, a layer held, a
 * second gateway), a pull taken over when its gateway dies, and creates from `image.ref`.
 */

let registry: TestRegistry;
let proxy: RegistryProxy;
let cluster: TestCluster;
let token: string;
let fixture: { base: Buffer; upper: Buffer };
const memoryDir = `/dev/shm/rollbox-pull-test-${process.pid}`;
const made: string[] = [];

/** A layer of its own (random bytes, so nothing else holds it) of about `bytes`. */
const execFileAsync = promisify(execFile);

async function ownLayer(tag: string, bytes = 64 * 1024): Promise<Buffer> {
  return layerTar([{ name: `srv/${tag}/`, type: 'directory' }, { name: `srv/${tag}/data.bin`, content: randomBytes(bytes) }, { name: `srv/${tag}/name`, content: `${tag}\n` }]);
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

async function storeFiles(): Promise<string[]> {
  return (await fs.readdir(path.join(cluster.rootDir, 'layers', 'sha256')).catch(() => [] as string[])).sort();
}

const blobGets = (requests: { method: string; path: string }[], repo: string): string[] => requests.filter((r) => r.method === 'GET' && r.path.startsWith(`/v2/${repo}/blobs/`)).map((r) => r.path);

beforeAll(async () => {
  await fs.mkdir(memoryDir, { recursive: true });
  fixture = await imageFixtureLayers();
  registry = await startTestRegistry();
  proxy = await startRegistryProxy(registry.url);
  cluster = await startTestCluster({
    workers: [{ nodeId: 'node-pull' }],
    env: {
      ROLLBOX_REGISTRY_INSECURE: [registry.host, proxy.host].join(','),
      ROLLBOX_REGISTRY_INTERNAL: [registry.host, proxy.host].join(','),
      ROLLBOX_IMAGE_PULL_LEASE_MS: '1500',
      ROLLBOX_REGISTRY_TIMEOUT_MS: '5000',
      // Layers nothing references go at once (the import-vs-pull comparison starts from an empty store).
      ROLLBOX_LAYER_GC_GRACE_MS: '0',
      ROLLBOX_LAYER_GC_INTERVAL_MS: '300',
      // A tmpfs of this test's own for pulled trees (other tests pull at the same time).
      ROLLBOX_IMAGE_PULL_MEMORY_DIR: memoryDir,
    },
  });
  token = await cluster.token('pulls', ['layer:write', 'sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:run']);
}, 120_000);
afterAll(async () => {
  for (const id of made) await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`).catch(() => undefined);
  // The registry first: it is ended by pid whatever becomes of the cluster's stop.
  await proxy?.stop();
  await registry?.stop();
  await cluster?.stop();
  await fs.rm(memoryDir, { recursive: true, force: true });
});

describe('image pull', () => {
  it('gives the same layers and the same sandbox view as an import of the same archive', async () => {
    const def: ImageDef = { layers: [fixture.base, fixture.upper], config: FIXTURE_CONFIG };
    const archive = await ociLayout([def], { gzip: true });
    const imported = await api(cluster, token, 'POST', '/v1/images?name=imported-fixture', new Uint8Array(archive), { 'content-type': 'application/x-tar' });
    expect(imported.status, JSON.stringify(imported.body)).toBe(201);
    const importedDigests = (imported.body as ImageRecord).layers.map((l) => l.digest);
    // The import's layers go (garbage collection), so the pull builds its own.
    expect((await api(cluster, token, 'DELETE', '/v1/images/imported-fixture')).status).toBe(200);
    await waitFor('the imported layers collected', async () => {
      const files = await storeFiles();
      return importedDigests.every((d) => !files.some((f) => f.startsWith(`${d.slice('sha256:'.length)}.`)));
    }, 20_000);

    await registry.push(archive, 't/fixture:1');
    const started = await startPull(cluster, token, { ref: `${registry.host}/t/fixture:1` });
    const name = `127.0.0.1-${registry.host.split(':')[1]}-t-fixture-1`;
    expect(started).toMatchObject({ name, state: 'pulling', ref: `${registry.host}/t/fixture:1`, layers: [], pull: { state: 'pulling', platform: 'linux/amd64' } });
    const done = await pullEnded(cluster, token, name, started.pull!.id);
    const oci = ociImage(def, { gzip: true });
    expect(done, JSON.stringify(done)).toMatchObject({ state: 'ready', digest: oci.manifest.descriptor.digest, platform: 'linux/amd64', config: FIXTURE_CONFIG, pull: { state: 'ready' } });
    expect(done.layers.map((l) => l.digest)).toEqual(importedDigests);
    expect(done.layers.map((l) => l.diffId)).toEqual(oci.layers.map((l) => l.diffId));
    const blobBytes = oci.layers.reduce((s, l) => s + l.blob.length, 0);
    expect(done.pull!.progress).toEqual({ layersTotal: 2, layersDone: 2, layersReused: 0, bytesTotal: blobBytes, bytesDone: blobBytes, bytesFetched: blobBytes });

    const id = await sandbox({ image: { base: name } });
    await checkFixtureView((cmd, extra) => sh(id, cmd, extra));
  }, 120_000);

  it('pulls plain, gzip and zstd layers', async () => {
    const [plain, gz, zst] = await Promise.all(['plain', 'gzip', 'zstd'].map((k) => layerTar([{ name: `${k}.txt`, content: `${k} layer\n` }, { name: `${k}.bin`, content: randomBytes(50_000) }])));
    const def: ImageDef = { layers: [fixture.base, plain!, gz!, zst!] };
    await registry.push(await ociLayout([def], { gzip: [true, false, true, 'zstd'] }), 't/compressed:1');
    const done = await pulled(cluster, token, { ref: `${registry.host}/t/compressed:1` });
    expect(done, JSON.stringify(done)).toMatchObject({ state: 'ready' });
    expect(done.layers.map((l) => l.diffId)).toEqual(ociImage(def).layers.map((l) => l.diffId));
    expect(await sh(await sandbox({ image: { base: done.name } }), 'cat /plain.txt /gzip.txt /zstd.txt')).toMatchObject({ stdout: 'plain layer\ngzip layer\nzstd layer\n' });
  }, 120_000);

  it('writes a pulled layer once as it streams in; built by extraction, a tree that outgrows its memory room goes to disk, its blob fetched again', async () => {
    // 6 MiB of one byte gzips to a few KiB: far past the 4x-blob reservation on the tmpfs.
    const squeezedLayer = (text: string) => layerTar([{ name: 'squeezed.bin', content: Buffer.alloc(6 * 1024 * 1024, 0x61) }, { name: 'squeezed.txt', content: text }]);
    const pullSqueezed = async (gateway: Pick<TestCluster, 'url'>, tag: string, text: string): Promise<{ fetched: number; blob: number; baseBlob: number }> => {
      const def: ImageDef = { layers: [fixture.base, await squeezedLayer(text)] };
      await registry.push(await ociLayout([def], { gzip: true }), `t/squeezed:${tag}`);
      const done = await pulled(gateway, token, { ref: `${registry.host}/t/squeezed:${tag}` });
      expect(done, JSON.stringify(done)).toMatchObject({ state: 'ready' });
      expect(done.pull!.progress).toMatchObject({ layersDone: 2, bytesDone: done.pull!.progress.bytesTotal });
      const id = await sandbox({ image: { base: done.name } });
      expect(await sh(id, 'cat /squeezed.txt; wc -c < /squeezed.bin')).toMatchObject({ stdout: `${text}${6 * 1024 * 1024}\n` });
      const [base, squeezed] = ociImage(def, { gzip: true }).layers;
      return { fetched: done.pull!.progress.bytesFetched, blob: squeezed!.blob.length, baseBlob: base!.blob.length };
    };
    // Written straight from the stream (the default): fetched once, no tree anywhere (the base too, unless an earlier test pulled it).
    const direct = await pullSqueezed(cluster, 'direct', 'direct\n');
    expect([direct.blob, direct.blob + direct.baseBlob]).toContain(direct.fetched);
    expect(await fs.readdir(memoryDir)).toEqual([]);

    const extracting = await cluster.spawnGateway({ name: 'gw-extract', env: { ROLLBOX_LAYER_BUILD: 'extract' } });
    try {
      // Fetched twice: once into memory (given up), once to disk.
      const extracted = await pullSqueezed({ url: extracting.url }, 'extract', 'extracted\n');
      expect(extracted.fetched).toBe(2 * extracted.blob);
      const [own, ...others] = await fs.readdir(memoryDir);
      expect(others).toEqual([]);
      expect(await fs.readdir(path.join(memoryDir, own!))).toEqual([]);
    } finally {
      extracting.child.kill('SIGTERM');
    }
  }, 120_000);

  it('yields the platform asked from a multi-platform index', async () => {
    const arch = (a: string) => layerTar([...busyboxEntries(), { name: 'arch', content: `${a}\n` }]);
    const layout = await ociLayout(
      [
        { layers: [await arch('arm64')], os: 'linux', architecture: 'arm64', variant: 'v8' },
        { layers: [await arch('amd64')], os: 'linux', architecture: 'amd64' },
      ],
      { index: 'nested', gzip: true },
    );
    await registry.push(layout, 't/multi:1', { all: true });
    const amd = await pulled(cluster, token, { ref: `${registry.host}/t/multi:1` });
    expect(amd).toMatchObject({ state: 'ready', platform: 'linux/amd64' });
    const arm = await pulled(cluster, token, { ref: `${registry.host}/t/multi:1`, platform: 'linux/arm64' });
    expect(arm).toMatchObject({ name: `${amd.name}-linux-arm64`, state: 'ready', platform: 'linux/arm64/v8' });
    expect(await sh(await sandbox({ image: { base: amd.name } }), 'cat /arch')).toMatchObject({ stdout: 'amd64\n' });
    expect(await sh(await sandbox({ image: { base: arm.name } }), 'cat /arch')).toMatchObject({ stdout: 'arm64\n' });
    const none = await pulled(cluster, token, { ref: `${registry.host}/t/multi:1`, platform: 'linux/s390x' });
    expect(none).toMatchObject({ state: 'failed', error: { code: 'invalid_image' } });
    expect(none.error!.message).toMatch(/no manifest for platform linux\/s390x \(the image has: linux\/arm64\/v8, linux\/amd64\)/);
  }, 120_000);

  it('does the work once: two pulls at once (on two gateways) share one, and layers held are not fetched again', async () => {
    const def: ImageDef = { layers: [fixture.base, await ownLayer('twice', 2_000_000)] };
    await registry.push(await ociLayout([def], { gzip: true }), 't/twice:1');
    const second = await cluster.spawnGateway({ name: 'gw-second' });
    try {
      proxy.setRate(1_500_000); // about two seconds: the pulls overlap
      const ref = `${proxy.host}/t/twice:1`;
      const before = proxy.requests.length;
      const [a, b] = await Promise.all([startPull(cluster, token, { ref }), startPull(cluster, token, { ref })]);
      const c = await startPull({ url: second.url }, token, { ref });
      expect(b.pull!.id).toBe(a.pull!.id);
      expect(c.pull!.id).toBe(a.pull!.id);
      const done = await pullEnded(cluster, token, a.name, a.pull!.id);
      expect(done.state).toBe('ready');
      proxy.setRate(0);
      // One pull's blobs, each once: the config and the new layer (the fixture's base is held since the first test).
      const fetched = blobGets(proxy.requests.slice(before), 't/twice');
      expect(fetched).toHaveLength(2);
      expect(new Set(fetched).size).toBe(2);
      expect(done.pull!.progress).toMatchObject({ layersTotal: 2, layersReused: 1 });

      // Again: a new pull of the same ref, every layer held: no layer blob is fetched.
      const mark = proxy.requests.length;
      const again = await pulled(cluster, token, { ref });
      expect(again.pull!.id).not.toBe(a.pull!.id);
      expect(again).toMatchObject({ state: 'ready', layers: done.layers, pull: { progress: { layersReused: 2, bytesFetched: 0 } } });
      expect(blobGets(proxy.requests.slice(mark), 't/twice')).toHaveLength(1); // the config only
    } finally {
      proxy.setRate(0);
      second.child.kill('SIGTERM');
    }
  }, 120_000);

  it('takes over a pull whose gateway died, and ends it', async () => {
    const def: ImageDef = { layers: [await ownLayer('orphan-a', 1_500_000), await ownLayer('orphan-b', 1_500_000)] };
    await registry.push(await ociLayout([def], { gzip: false }), 't/orphan:1');
    const doomed = await cluster.spawnGateway({ name: 'gw-doomed' });
    proxy.setRate(600_000);
    try {
      const started = await startPull({ url: doomed.url }, token, { ref: `${proxy.host}/t/orphan:1` });
      await waitFor('bytes of the doomed pull', async () => ((await api<ImageRecord>(cluster, token, 'GET', `/v1/images/${started.name}`)).body.pull?.progress.bytesFetched ?? 0) > 0, 20_000);
      doomed.child.kill('SIGKILL');
      // Nothing it started outlives it: its layer decompressors (each writing into a FIFO its layer thread may not have opened yet) die with it.
      const leftOver = () => execFileAsync('pgrep', ['-f', path.join(cluster.rootDir, 'gw-doomed')]).then((r) => r.stdout.trim(), () => '');
      await waitFor('the doomed gateway\'s decompressors gone', async () => (await leftOver()) === '' || undefined, 5_000).catch(async (err: Error) => {
        throw new Error(`${err.message}: ${await leftOver()}`);
      });
      const record = (await api<ImageRecord>(cluster, token, 'GET', `/v1/images/${started.name}`)).body;
      expect(record.state).toBe('pulling');
      proxy.setRate(0);
      const done = await pullEnded(cluster, token, started.name, started.pull!.id, 60_000);
      expect(done).toMatchObject({ state: 'ready', pull: { resumed: 1, state: 'ready' } });
      expect(done.layers.map((l) => l.diffId)).toEqual(ociImage(def).layers.map((l) => l.diffId));
    } finally {
      proxy.setRate(0);
      if (doomed.child.exitCode === null && doomed.child.signalCode === null) doomed.child.kill('SIGKILL');
    }
  }, 120_000);

  it('creates from image.ref: pulled first when no image holds it, then as it is; an image that cannot be pulled is a coded error', async () => {
    const def: ImageDef = { layers: [fixture.base, await layerTar([{ name: 'hello', content: 'from a registry\n' }])], config: { Env: ['PATH=/bin'] } };
    await registry.push(await ociLayout([def], { gzip: true }), 't/run:1');
    const ref = `${registry.host}/t/run:1`;
    const id = await sandbox({ image: { ref } });
    expect(await sh(id, 'cat /hello')).toMatchObject({ exitCode: 0, stdout: 'from a registry\n' });
    const name = `127.0.0.1-${registry.host.split(':')[1]}-t-run-1`;
    const record = (await api<ImageRecord>(cluster, token, 'GET', `/v1/images/${name}`)).body;
    expect(record).toMatchObject({ state: 'ready', ref });
    const sandboxRecord = (await api(cluster, token, 'GET', `/v1/sandboxes/${id}`)).body;
    expect(sandboxRecord.layerDigests).toEqual(record.layers.map((l) => l.digest));
    // Held now: the next create does not pull again.
    await sandbox({ image: { ref, layers: [] } });
    expect((await api<ImageRecord>(cluster, token, 'GET', `/v1/images/${name}`)).body.pull!.id).toBe(record.pull!.id);
    const run = await api(cluster, token, 'POST', '/v1/run', { image: { ref }, cmd: 'cat /hello', resources: { memoryMiB: 64, diskMiB: 64 } });
    expect(run.body, JSON.stringify(run.body)).toMatchObject({ status: 'ok', stdout: 'from a registry\n' });
    // A batch task's image, and its grade's fresh sandbox of it, may be a ref.
    const batchToken = await cluster.token('pulls', ['batch:submit']);
    const submitted = await api(cluster, batchToken, 'POST', '/v1/batches', {
      tasks: [{ customId: 'from-ref', image: { ref }, resources: { memoryMiB: 32 }, steps: [{ cmd: 'cat /hello' }], grade: { cmd: 'cat /hello', mode: 'fresh-sandbox' } }],
    });
    expect(submitted.status, JSON.stringify(submitted.body)).toBe(201);
    const batch = await waitFor('the batch', async () => {
      const b = (await api(cluster, batchToken, 'GET', `/v1/batches/${submitted.body.id}`)).body;
      return b.state === 'completed' ? b : undefined;
    }, 60_000);
    const results = await fetch(`${cluster.url}/v1/batches/${submitted.body.id}/results`, { headers: { authorization: `Bearer ${batchToken}` } }).then((r) => r.text());
    expect(batch.counts, results).toMatchObject({ succeeded: 1, failed: 0, infra_error: 0 });
    expect(JSON.parse(results.trim())).toMatchObject({ customId: 'from-ref', status: 'succeeded', grade: { exitCode: 0, stdout: 'from a registry\n' } });
    // A warm pool's image may be a ref too (its layers are the pulled image's).
    const admin = await cluster.token('pulls-admin', ['admin']);
    const pool = await api(cluster, admin, 'PUT', '/v1/pools/from-ref', { image: { ref }, size: 0, diskMiB: 64 });
    expect(pool.status, JSON.stringify(pool.body)).toBe(200);
    expect(pool.body).toMatchObject({ image: { base: name }, layerDigests: record.layers.map((l) => l.digest) });
    await api(cluster, admin, 'DELETE', '/v1/pools/from-ref');

    // A pull that takes longer than the create may wait: 504 image_pull_timeout, and the pull goes on.
    await registry.push(await ociLayout([{ layers: [fixture.base, await ownLayer('slow', 1_000_000)] }], { gzip: true }), 't/slow:1');
    const impatient = await cluster.spawnGateway({ name: 'gw-impatient', env: { ROLLBOX_IMAGE_PULL_WAIT_MS: '1500' } });
    try {
      proxy.setRate(100_000);
      const slowRef = `${proxy.host}/t/slow:1`;
      const waited = await api({ url: impatient.url }, token, 'POST', '/v1/sandboxes', { image: { ref: slowRef }, resources: { memoryMiB: 64, diskMiB: 64 } });
      expect(waited.status, JSON.stringify(waited.body)).toBe(504);
      expect(waited.body.error).toMatchObject({ code: 'image_pull_timeout' });
      proxy.setRate(0);
      const slowName = `127.0.0.1-${proxy.host.split(':')[1]}-t-slow-1`;
      const slow = await pullEnded(cluster, token, slowName, (await api<ImageRecord>(cluster, token, 'GET', `/v1/images/${slowName}`)).body.pull!.id);
      expect(slow.state).toBe('ready');
    } finally {
      proxy.setRate(0);
      impatient.child.kill('SIGTERM');
    }

    const missing = await api(cluster, token, 'POST', '/v1/sandboxes', { image: { ref: `${registry.host}/t/run:nope` } });
    expect(missing.status).toBe(404);
    expect(missing.body.error).toMatchObject({ code: 'image_not_found' });
    expect(missing.body.error.message).toMatch(/MANIFEST_UNKNOWN/);
    const both = await api(cluster, token, 'POST', '/v1/sandboxes', { image: { ref, base: 'busybox' } });
    expect(both.status).toBe(400);
    expect(both.body.error.message).toMatch(/base or ref, not both/);
    const bad = await api(cluster, token, 'POST', '/v1/sandboxes', { image: { ref: 'Upper/Case' } });
    expect(bad.body.error).toMatchObject({ code: 'invalid_request' });
  }, 120_000);
});

