import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Scope } from '../src/api/index.ts';
import { api, startTestCluster, type TestCluster } from './support/cluster.ts';
import { busyboxEntries } from './support/image-fixture.ts';
import { dockerSave, layerTar } from './support/oci.ts';
import { tarOf } from './support/tar.ts';

/**
 * The walls between tenants around every layer-shaped thing (issue 38): a tenant lists,
 * reads, downloads, forks, names, deletes and creates from only its own layers, snapshots,
 * hibernation images and images, and those an operator published; another tenant's answer
 * 404 as if they did not exist.
 */
const SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:snapshot', 'layer:read', 'layer:write'];
const TAR = { 'content-type': 'application/x-tar' };
let cluster: TestCluster;
let alice: string;
let bob: string;
let admin: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-walls' }] });
  [alice, bob, admin] = await Promise.all([cluster.token('tenant-a', SCOPES), cluster.token('tenant-b', SCOPES), cluster.token('ops', ['admin'])]);
}, 120_000);
afterAll(async () => {
  await cluster?.stop();
});

const create = async (token: string, body: object = {}) => {
  const r = await api(cluster, token, 'POST', '/v1/sandboxes', { ...body });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body.id as string;
};
const exec = async (token: string, id: string, cmd: string) => {
  const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return r.body as { stdout: string; stderr: string; exitCode: number };
};
const digestsSeenBy = async (token: string) => ((await api(cluster, token, 'GET', '/v1/layers')).body.layers as { digest: string }[]).map((l) => l.digest);

/** Every way to reach a layer by its digest or name: the status each answers. */
async function reach(token: string, ref: string, digest: string): Promise<Record<string, number>> {
  const forked = await api(cluster, token, 'POST', `/v1/snapshots/${digest}/fork`, { count: 1 });
  const created = await api(cluster, token, 'POST', '/v1/sandboxes', { image: { base: 'busybox', layers: [ref] } });
  return {
    record: (await api(cluster, token, 'GET', `/v1/layers/${ref}`)).status,
    blob: (await api(cluster, token, 'GET', `/v1/layers/${ref}/blob`)).status,
    meta: (await api(cluster, token, 'GET', `/v1/layers/${ref}/meta`)).status,
    chunks: (await api(cluster, token, 'GET', `/v1/layers/${ref}/chunks`)).status,
    fork: forked.status,
    create: created.status,
  };
}

describe('tenancy walls', () => {
  it('keeps a snapshot from another tenant: not listed, read, downloaded, forked, created from or deleted; its files never reach them', async () => {
    const source = await create(alice);
    await exec(alice, source, 'echo alice-secret > /root/secret.txt');
    const snapshot = await api(cluster, alice, 'POST', `/v1/sandboxes/${source}/snapshot`, { name: 'alice-snap' });
    expect(snapshot.status, JSON.stringify(snapshot.body)).toBe(201);
    const digest = snapshot.body.digest as string;

    expect(await digestsSeenBy(bob)).not.toContain(digest);
    for (const ref of [digest, 'alice-snap']) {
      const seen = await reach(bob, ref, digest);
      for (const [route, status] of Object.entries(seen)) expect([route, status]).toEqual([route, 404]);
    }
    expect((await api(cluster, bob, 'DELETE', '/v1/layers/alice-snap')).status).toBe(404);

    // Alice is served all of it; her name still stands after Bob's delete.
    expect(await digestsSeenBy(alice)).toContain(digest);
    expect((await api(cluster, alice, 'GET', '/v1/layers/alice-snap')).body).toMatchObject({ digest, name: 'alice-snap', published: false });
    expect((await api(cluster, alice, 'GET', `/v1/layers/${digest}/blob`)).status).toBe(200);
    const fork = await api(cluster, alice, 'POST', `/v1/snapshots/${digest}/fork`, { count: 1 });
    expect(fork.status, JSON.stringify(fork.body)).toBe(201);
    const child = fork.body.children[0].id as string;
    expect((await exec(alice, child, 'cat /root/secret.txt')).stdout).toBe('alice-secret\n');
    const restored = await create(alice, { image: { base: 'busybox', layers: ['alice-snap'] } });
    expect((await exec(alice, restored, 'cat /root/secret.txt')).stdout).toBe('alice-secret\n');

    // Published by an operator: every tenant sees and forks it; taken back: the wall again.
    expect((await api(cluster, bob, 'PUT', `/v1/layers/${digest}/published`)).status).toBe(403);
    expect((await api(cluster, admin, 'PUT', `/v1/layers/${digest}/published`)).body).toMatchObject({ digest, published: true });
    expect(await digestsSeenBy(bob)).toContain(digest);
    const bobsFork = await api(cluster, bob, 'POST', `/v1/snapshots/${digest}/fork`, { count: 1 });
    expect(bobsFork.status, JSON.stringify(bobsFork.body)).toBe(201);
    expect((await api(cluster, admin, 'DELETE', `/v1/layers/${digest}/published`)).body).toMatchObject({ published: false });
    expect((await reach(bob, digest, digest)).record).toBe(404);
  }, 120_000);

  it('keeps layer names per tenant: the same name stands for each tenant\'s own layer', async () => {
    const upload = async (token: string, content: string) => {
      const r = await api(cluster, token, 'POST', '/v1/layers?name=shared-name', new Uint8Array(await tarOf([{ name: 'who.txt', content }])), TAR);
      expect(r.status, JSON.stringify(r.body)).toBe(201);
      return r.body.digest as string;
    };
    const [mine, theirs] = [await upload(alice, 'alice\n'), await upload(bob, 'bob\n')];
    expect(mine).not.toBe(theirs);
    expect((await api(cluster, alice, 'GET', '/v1/layers/shared-name')).body.digest).toBe(mine);
    expect((await api(cluster, bob, 'GET', '/v1/layers/shared-name')).body.digest).toBe(theirs);
    expect((await api(cluster, bob, 'GET', `/v1/layers/${mine}`)).status).toBe(404);
    const bobs = await create(bob, { image: { base: 'busybox', layers: ['shared-name'] } });
    expect((await exec(bob, bobs, 'cat /who.txt')).stdout).toBe('bob\n');
    // Bob's delete drops his name only.
    expect((await api(cluster, bob, 'DELETE', '/v1/layers/shared-name')).status).toBe(200);
    expect((await api(cluster, alice, 'GET', '/v1/layers/shared-name')).body.digest).toBe(mine);
  }, 60_000);

  it('keeps a hibernation image from another tenant', async () => {
    const before = new Set(await digestsSeenBy(bob));
    const id = await create(alice);
    await exec(alice, id, 'echo asleep > /root/h.txt');
    const paused = await api(cluster, alice, 'POST', `/v1/sandboxes/${id}/pause`, { mode: 'hibernate' });
    expect(paused.body.state).toBe('hibernated');
    const hibernation = paused.body.hibernationLayer as string;
    expect(hibernation).toMatch(/^sha256:/);
    // It is no layer of the registry (the sandbox's record holds it): no tenant reaches it by the layer routes.
    expect((await digestsSeenBy(bob)).filter((d) => !before.has(d))).toEqual([]);
    expect(await reach(bob, hibernation, hibernation)).toEqual({ record: 404, blob: 404, meta: 404, chunks: 404, fork: 404, create: 404 });
    expect((await api(cluster, bob, 'GET', `/v1/sandboxes/${id}`)).status).toBe(404);
    expect((await api(cluster, alice, 'POST', `/v1/sandboxes/${id}/resume`, {})).body.state).toBe('running');
    expect((await exec(alice, id, 'cat /root/h.txt')).stdout).toBe('asleep\n');
  }, 60_000);

  it('keeps images per tenant: another tenant neither lists, reads, deletes nor creates from one; the same name is its own', async () => {
    const archive = await dockerSave({ layers: [await layerTar([...busyboxEntries(), { name: 'img.txt', content: 'alice image\n' }])], config: { Env: ['OWNER=alice'] } });
    const imported = await api(cluster, alice, 'POST', '/v1/images?name=team-img', new Uint8Array(archive), TAR);
    expect(imported.status, JSON.stringify(imported.body)).toBe(201);
    const names = async (token: string) => ((await api(cluster, token, 'GET', '/v1/images')).body.images as { name: string }[]).map((i) => i.name);
    expect(await names(alice)).toContain('team-img');
    expect(await names(bob)).not.toContain('team-img');
    expect((await api(cluster, bob, 'GET', '/v1/images/team-img')).status).toBe(404);
    expect((await api(cluster, bob, 'DELETE', '/v1/images/team-img')).status).toBe(404);
    expect((await api(cluster, bob, 'POST', '/v1/sandboxes', { image: { base: 'team-img' } })).status).toBe(404);
    for (const layer of imported.body.layers as { digest: string }[]) expect((await api(cluster, bob, 'GET', `/v1/layers/${layer.digest}`)).status).toBe(404);
    const sandbox = await create(alice, { image: { base: 'team-img' } });
    expect((await exec(alice, sandbox, 'cat /img.txt; echo $OWNER')).stdout).toBe('alice image\nalice\n');

    // Bob's own image of that name is his; published, Alice's is seen by Bob only where he has none.
    const bobsArchive = await dockerSave({ layers: [await layerTar([...busyboxEntries(), { name: 'img.txt', content: 'bob image\n' }])] });
    expect((await api(cluster, bob, 'POST', '/v1/images?name=team-img', new Uint8Array(bobsArchive), TAR)).status).toBe(201);
    const bobs = await create(bob, { image: { base: 'team-img' } });
    expect((await exec(bob, bobs, 'cat /img.txt')).stdout).toBe('bob image\n');
    expect((await exec(alice, await create(alice, { image: { base: 'team-img' } }), 'cat /img.txt')).stdout).toBe('alice image\n');
  }, 90_000);

  it('keeps the built-in base usable by every tenant', async () => {
    for (const token of [alice, bob]) {
      const id = await create(token, { image: { base: 'busybox' } });
      expect((await exec(token, id, 'echo ok')).stdout).toBe('ok\n');
    }
    expect((await api(cluster, bob, 'GET', '/v1/layers/busybox')).body.published).toBe(true);
  }, 60_000);
});
