import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, startTestCluster, type TestCluster } from './support/cluster.ts';

let cluster: TestCluster;
let builder: string;
let agent: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-snap' }] });
  builder = await cluster.token('lab', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:snapshot']);
  agent = await cluster.token('lab', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
});
afterAll(async () => cluster?.stop());

const exec = async (id: string, cmd: string) => (await api(cluster, builder, 'POST', `/v1/sandboxes/${id}/exec`, { cmd })).body;
const create = async (layers: string[]) => {
  const r = await api(cluster, builder, 'POST', '/v1/sandboxes', { image: { base: 'busybox', layers } });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body.id as string;
};

describe('snapshots (pack_diff)', () => {
  it('keeps created, deleted and modified files, leaves out excluded paths, and chains', async () => {
    const build = await create([]);
    await exec(build, 'echo created > /root/new; rm /bin/vi; echo modified >> /etc/passwd; mkdir -p /answers && echo 42 > /answers/ref; echo cache > /root/.cache');
    expect((await api(cluster, agent, 'POST', `/v1/sandboxes/${build}/snapshot`, {})).status).toBe(403);

    const snap = await api(cluster, builder, 'POST', `/v1/sandboxes/${build}/snapshot`, { name: 'env-1', exclude: ['/answers', '/root/.cache'] });
    expect(snap.status, JSON.stringify(snap.body)).toBe(201);
    const base = (await api(cluster, builder, 'GET', '/v1/layers/busybox')).body;
    expect(snap.body).toMatchObject({ name: 'env-1', parents: [base.digest] });
    expect((await exec(build, 'cat /root/new')).stdout).toBe('created\n'); // the build sandbox runs on

    const restored = await create(['env-1']);
    const seen = await exec(restored, 'cat /root/new; ls /bin/vi; tail -n 1 /etc/passwd; ls /answers /root/.cache; echo end');
    expect(seen.stdout).toBe('created\nmodified\nend\n');
    expect(seen.stderr).toContain('/bin/vi');
    expect(seen.stderr).toContain('/answers');
    expect(seen.stderr).toContain('/root/.cache');

    // A chain: env-2 on env-1, env-3 on env-2.
    await exec(restored, 'echo two > /root/two; rm /root/new');
    const snap2 = await api(cluster, builder, 'POST', `/v1/sandboxes/${restored}/snapshot`, { name: 'env-2' });
    expect(snap2.body.parents).toEqual([base.digest, snap.body.digest]);
    const third = await create(['env-1', 'env-2']);
    await exec(third, 'echo three > /root/three; echo changed > /root/two');
    const snap3 = await api(cluster, builder, 'POST', `/v1/sandboxes/${third}/snapshot`, { name: 'env-3' });
    expect(snap3.status).toBe(201);
    const last = await create(['env-1', 'env-2', 'env-3']);
    expect((await exec(last, 'ls /root/new 2>/dev/null; cat /root/two /root/three; tail -n 1 /etc/passwd')).stdout).toBe('changed\nthree\nmodified\n');

    const listed = (await api(cluster, builder, 'GET', '/v1/layers')).body.layers.map((l: { name?: string }) => l.name);
    expect(listed).toEqual(expect.arrayContaining(['env-1', 'env-2', 'env-3']));
    for (const id of [build, restored, third, last]) await api(cluster, builder, 'DELETE', `/v1/sandboxes/${id}`);
  });
});
