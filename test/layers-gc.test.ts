import fs from 'node:fs';
import path from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { hostTraces } from './support/host.ts';
import { tarOf } from './support/tar.ts';
import { keys, migrateKeyLayout } from '../src/registry/index.ts';
import { FORK_IMAGE_MAX_AGE_MS } from '../src/gateway/index.ts';

let cluster: TestCluster;
let token: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-gc' }], env: { ROLLBOX_LAYER_GC_GRACE_MS: '1500', ROLLBOX_LAYER_GC_INTERVAL_MS: '300', ROLLBOX_NODE_IDLE_UNMOUNT_MS: '300' } });
  token = await cluster.token('gc', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:snapshot', 'layer:write']);
});
afterAll(async () => cluster?.stop());

/** Any file of the layer in the store: a split layer's (uploads) or a single image (snapshots). */
const filesOf = (digest: string) => ['erofs', 'chunks', 'meta', 'blob'].map((ext) => path.join(cluster.rootDir, 'layers', 'sha256', `${digest.slice('sha256:'.length)}.${ext}`));
const stored = (digest: string) => filesOf(digest).some((f) => fs.existsSync(f));
const registered = async (digest: string) => (await api(cluster, token, 'GET', `/v1/layers/${digest}`)).status === 200;
const collected = (digest: string) => waitFor(`layer ${digest} collected`, async () => !stored(digest) && !(await registered(digest)), 30_000);
const create = async (layers: string[] = []) => {
  const r = await api(cluster, token, 'POST', '/v1/sandboxes', { image: { base: 'busybox', layers }, resources: { memoryMiB: 64 } });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body.id as string;
};
const sh = async (id: string, cmd: string) => (await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd })).body.stdout as string;
const snapshot = async (id: string, name?: string) => {
  const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/snapshot`, name ? { name } : {});
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body as { digest: string; parents: string[] };
};
async function upload(name: string, file: string): Promise<string> {
  const tar = await tarOf([{ name: file, content: `${name}\n` }]);
  const r = await api(cluster, token, 'POST', `/v1/layers?name=${name}`, new Uint8Array(tar), { 'content-type': 'application/x-tar' });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body.digest;
}
const state = async (id: string) => (await api(cluster, token, 'GET', `/v1/sandboxes/${id}`)).body;
const setPaused = async (id: string, action: 'pause' | 'resume') => {
  const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/${action}`, action === 'pause' ? { mode: 'hibernate' } : {});
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return r.body;
};

describe('layer garbage collection', () => {
  it('collects unreferenced layers after the grace, keeps named, used, hibernated and parent layers', async () => {
    const base = (await api(cluster, token, 'GET', '/v1/layers/busybox')).body.digest as string;
    const build = await create();
    await sh(build, 'echo one > /root/one');
    const unnamed = await snapshot(build);
    await sh(build, 'echo two > /root/two');
    const named = await snapshot(build, 'keep-me');

    const inUse = await upload('in-use', 'used.txt');
    const user = await create(['in-use']);
    expect((await api(cluster, token, 'DELETE', '/v1/layers/in-use')).status).toBe(200);
    expect((await api(cluster, token, 'GET', '/v1/layers/in-use')).status).toBe(404);
    expect((await api(cluster, token, 'DELETE', '/v1/layers/in-use')).status).toBe(404);

    const parent = await upload('parent', 'parent.txt');
    const onParent = await create(['parent']);
    await sh(onParent, 'echo child > /root/child');
    const child = await snapshot(onParent, 'child');
    expect(child.parents).toEqual([base, parent]);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${onParent}`);
    await api(cluster, token, 'DELETE', '/v1/layers/parent');

    const sleeper = await create();
    await sh(sleeper, 'echo zzz > /root/z');
    const hibernated = (await setPaused(sleeper, 'pause')).hibernationLayer as string;
    expect(stored(hibernated)).toBe(true);

    await collected(unnamed.digest);
    // Everything below was at least as old as the collected layer: still there, referenced.
    for (const digest of [base, named.digest, inUse, parent, child.digest, hibernated]) expect(stored(digest), digest).toBe(true);
    for (const digest of [base, named.digest, inUse, parent, child.digest]) expect(await registered(digest), digest).toBe(true);

    await api(cluster, token, 'DELETE', '/v1/layers/keep-me');
    await collected(named.digest);
    await api(cluster, token, 'DELETE', '/v1/layers/child');
    await collected(child.digest);
    await collected(parent); // its only referrer was the child's lineage
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${user}`);
    await collected(inUse);
    // The worker host unmounts a layer (and frees its loop device) once no sandbox uses it.
    await waitFor('loop device released', async () => !hostTraces(cluster.rootDir).loops.join('\n').includes(inUse.slice('sha256:'.length)));
    expect(stored(hibernated)).toBe(true);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${sleeper}`);
    await collected(hibernated);
    expect(stored(base) && (await registered(base))).toBe(true);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${build}`);
  });

  it('keeps one hibernation layer per sandbox across repeated hibernate and wake', async () => {
    const id = await create();
    // A deleted file (whiteout), an emptied and refilled directory (opaque), a new file.
    await sh(id, 'rm /bin/vi; rm -rf /etc && mkdir /etc && echo only > /etc/only; echo 0 > /root/n');
    const tree = 'ls /bin/vi 2>&1; ls /etc; cat /root/n';
    const layerDigests = (await state(id)).layerDigests;
    let previous: string | undefined;
    for (let round = 1; round <= 3; round++) {
      const asleep = await setPaused(id, 'pause');
      expect(asleep.layerDigests).toEqual(layerDigests); // the image layers never grow
      expect(asleep.hibernationLayer).not.toBe(previous);
      const woken = await setPaused(id, 'resume');
      expect(woken.hibernationLayer).toBeUndefined();
      expect(await sh(id, tree)).toBe(`ls: /bin/vi: No such file or directory\nonly\n${round - 1}\n`);
      await sh(id, `echo ${round} > /root/n`);
      if (previous) await collected(previous);
      previous = asleep.hibernationLayer;
    }
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
    await collected(previous!);
  });

  it('reads which layers live sandboxes use from counts; a Redis written before the hash tags and the counts is migrated once', async () => {
    const redis = new Redis(cluster.redisUrl);
    try {
      const used = await upload('used-by-old', 'old.txt');
      const old = await create(['used-by-old']);
      expect(Number(await redis.hget(keys.layerRefs, used))).toBe(1);
      await api(cluster, token, 'DELETE', '/v1/layers/used-by-old');
      // As a Redis written by an earlier rollbox: the old names, no count, no flag, no marks.
      await redis.hdel(keys.layerRefs, used);
      await redis.hdel(keys.sandbox(old), 'layerRefs');
      await redis.del(keys.layerRefsComplete, 'rb:key-layout');
      await redis.rename(keys.sandbox(old), `rb:sbx:${old}`);
      await migrateKeyLayout(redis);
      expect(await redis.exists(`rb:sbx:${old}`)).toBe(0);
      expect((await redis.hget(keys.sandbox(old), 'state'))).toBe('running');
      expect(await redis.get('rb:key-layout')).toBe('2');
      expect(await redis.exists(keys.layerRefsComplete)).toBe(1);
      expect(Number(await redis.hget(keys.layerRefs, used))).toBe(1);
      const unused = await upload('unused', 'unused.txt');
      await api(cluster, token, 'DELETE', '/v1/layers/unused');
      await collected(unused);
      // The old sandbox was counted: its layer stayed while `unused` went.
      expect(stored(used)).toBe(true);
      expect((await api(cluster, token, 'POST', `/v1/sandboxes/${old}/exec`, { cmd: 'cat /old.txt' })).status).toBe(200);
      await api(cluster, token, 'DELETE', `/v1/sandboxes/${old}`);
      await collected(used);
      expect(await redis.hget(keys.layerRefs, used)).toBeNull();
    } finally {
      redis.disconnect();
    }
  });

  it('removes the images of forks that keep processes left behind (a gateway or worker that died mid-fork), not a fork in progress', async () => {
    const dir = path.join(cluster.rootDir, 'layers', 'vmforks');
    const image = (name: string, ageMs: number) => {
      fs.mkdirSync(path.join(dir, name), { recursive: true });
      fs.writeFileSync(path.join(dir, name, 'ram'), 'x');
      const at = new Date(Date.now() - ageMs);
      fs.utimesSync(path.join(dir, name), at, at);
    };
    image('fp_left', FORK_IMAGE_MAX_AGE_MS + 60_000);
    image('fp_half.part-4242', FORK_IMAGE_MAX_AGE_MS + 60_000);
    image('fp_starting', 1000);
    await waitFor('the left-behind fork images removed', async () => fs.readdirSync(dir).join() === 'fp_starting', 30_000);
    fs.rmSync(dir, { recursive: true });
  });
});
