import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { hostTraces } from './support/host.ts';

let cluster: TestCluster;
let token: string;

beforeAll(async () => {
  // The scratch filesystem and layers linger a moment after their last sandbox (ROLLBOX_NODE_IDLE_UNMOUNT_MS); short here.
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-a', env: { ROLLBOX_NODE_IDLE_UNMOUNT_MS: '300' } }] });
  token = await cluster.token('team-a', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
});
afterAll(async () => {
  await cluster?.stop();
  expect(hostTraces(cluster.rootDir)).toEqual({ mounts: [], loops: [], containers: [] });
});

const exec = (id: string, body: object) => api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, body);

describe('sandbox lifecycle', () => {
  it('creates, runs commands over turns, deletes, and leaves nothing behind', async () => {
    const created = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 128 }, labels: { task: 't1' } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    expect(created.body).toMatchObject({ state: 'running', tenant: 'team-a', node: 'node-a' });
    const id = created.body.id as string;

    const echo = await exec(id, { argv: ['echo', 'hello'] });
    expect(echo.status).toBe(200);
    expect(echo.body).toMatchObject({ exitCode: 0, stdout: 'hello\n', timedOut: false, truncated: false, replayed: false });

    expect((await exec(id, { cmd: 'echo turn-one > /root/notes.txt' })).body.exitCode).toBe(0);
    expect((await exec(id, { cmd: 'cat /root/notes.txt; exit 3' })).body).toMatchObject({ stdout: 'turn-one\n', exitCode: 3 });

    const withEnv = await exec(id, { cmd: 'echo $GREETING; pwd', env: { GREETING: 'hi' }, cwd: '/tmp', stdin: '' });
    expect(withEnv.body.stdout, JSON.stringify(withEnv.body)).toBe('hi\n/tmp\n');
    expect((await exec(id, { argv: ['cat'], stdin: 'from stdin' })).body.stdout).toBe('from stdin');

    const listed = await api(cluster, token, 'GET', '/v1/sandboxes?label=task=t1');
    expect(listed.body.sandboxes.map((s: { id: string }) => s.id)).toEqual([id]);

    const workerDir = path.join(cluster.rootDir, 'node-a', 'worker');
    expect(hostTraces(cluster.rootDir).containers).toEqual([`rb-${id}`]);

    const deleted = await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
    expect(deleted.body).toMatchObject({ id, state: 'terminated' });
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${id}`)).body.state).toBe('terminated');
    expect((await exec(id, { argv: ['true'] })).status).toBe(409);

    expect(hostTraces(cluster.rootDir).containers).toEqual([]);
    // A host without sandboxes keeps no mounts, once the linger is over.
    await waitFor('no mounts or loop devices left', async () => {
      const traces = hostTraces(cluster.rootDir);
      return traces.mounts.length === 0 && traces.loops.length === 0;
    });
    expect(fs.existsSync(path.join(workerDir, 'sandboxes', id))).toBe(false);
  });

  it('ends a sandbox at its TTL with failed(timeout) and removes its container', async () => {
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', { ttlSeconds: 1 });
    expect(sandbox.expiresAt).toBeDefined();
    const ended = await waitFor('ttl expiry', async () => {
      const s = await api(cluster, token, 'GET', `/v1/sandboxes/${sandbox.id}`);
      return s.body.state === 'failed' ? s.body : undefined;
    });
    expect(ended).toMatchObject({ failureReason: 'timeout' });
    expect(hostTraces(cluster.rootDir).containers).not.toContain(`rb-${sandbox.id}`);
  });

  it('isolates writes between two sandboxes on one layer and never changes the layer image', async () => {
    const layers = await api(cluster, token, 'GET', '/v1/layers');
    const base = layers.body.layers.find((l: { name?: string }) => l.name === 'busybox');
    // A split layer: its chunk table (whose sha256 is the digest), metadata image and data blob.
    const files = ['chunks', 'meta', 'blob'].map((ext) => path.join(cluster.config.layerStoreDir, 'sha256', `${base.digest.slice(7)}.${ext}`));
    const hashesOf = () => files.map((f) => createHash('sha256').update(fs.readFileSync(f)).digest('hex'));
    const hashBefore = hashesOf();
    expect(`sha256:${hashBefore[0]}`).toBe(base.digest);

    const [a, b] = await Promise.all([api(cluster, token, 'POST', '/v1/sandboxes', {}), api(cluster, token, 'POST', '/v1/sandboxes', {})]);
    expect([a.status, b.status]).toEqual([201, 201]);
    await exec(a.body.id, { cmd: 'echo secret > /etc/written-in-a; rm /bin/vi' });
    const inB = await exec(b.body.id, { cmd: 'cat /etc/written-in-a; ls /bin/vi' });
    expect(inB.body).toMatchObject({ exitCode: 0, stdout: '/bin/vi\n', stderr: expect.stringContaining('No such file') });
    expect((await exec(a.body.id, { cmd: 'cat /etc/written-in-a' })).body.stdout).toBe('secret\n');

    await Promise.all([a, b].map((s) => api(cluster, token, 'DELETE', `/v1/sandboxes/${s.body.id}`)));
    expect(hashesOf()).toEqual(hashBefore);
  });

  it('kills a command at its timeout together with its background children', async () => {
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    // The answer comes (well inside the test's own timeout) only because the timeout fired.
    const result = await exec(sandbox.id, { cmd: 'sleep 300 & sleep 301; echo never', timeoutMs: 500 });
    expect(result.body).toMatchObject({ timedOut: true, stdout: '' });
    const ps = await exec(sandbox.id, { cmd: 'ps -o args' });
    expect(ps.body.stdout).not.toContain('sleep 30');
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandbox.id}`);
  });
});
