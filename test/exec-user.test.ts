import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ExecResult } from '../src/api/index.ts';
import type { WorkerHandle } from '../src/roles/index.ts';
import { api, RESTART_TOLERANT_ENV, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { tarOf } from './support/tar.ts';

/**
 * Commands as a given user: the sandbox's default (`user` on create) or the exec's own,
 * resolved by the init against the sandbox's /etc/passwd and /etc/group (a layer here).
 */
// `4321` is a name (of uid 1000): a number in a user always means that uid.
const PASSWD = 'root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000:Alice:/home/alice:/bin/sh\n4321:x:1000:1000::/:/bin/sh\n';
const GROUP = 'root:x:0:\nalice:x:1000:\ndev:x:2000:bob,alice\n';

const NODE = 'node-u';
let cluster: TestCluster;
let worker: WorkerHandle;
let token: string;
let accounts: string;
const made: string[] = [];

beforeAll(async () => {
  cluster = await startTestCluster({ env: RESTART_TOLERANT_ENV });
  worker = await cluster.addWorker({ nodeId: NODE });
  token = await cluster.token('users', ['layer:write', 'sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
  const tar = await tarOf([
    { name: 'etc/passwd', content: PASSWD, mode: 0o644 },
    { name: 'etc/group', content: GROUP, mode: 0o644 },
  ]);
  const layer = await api(cluster, token, 'POST', '/v1/layers', new Uint8Array(tar), { 'content-type': 'application/x-tar' });
  expect(layer.status, JSON.stringify(layer.body)).toBe(201);
  accounts = layer.body.digest;
});
afterAll(async () => {
  for (const id of made) await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`).catch(() => undefined);
  await cluster?.stop();
});

async function sandbox(extra: object = {}): Promise<string> {
  const created = await api(cluster, token, 'POST', '/v1/sandboxes', { image: { base: 'busybox', layers: [accounts] }, resources: { memoryMiB: 64, diskMiB: 64 }, ...extra });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  made.push(created.body.id);
  return created.body.id;
}

const exec = (id: string, body: object) => api<ExecResult>(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, body);
/** stdout of a command that must succeed. */
async function out(id: string, cmd: string, extra: object = {}): Promise<string> {
  const run = await exec(id, { cmd, ...extra });
  expect(run.status, JSON.stringify(run.body)).toBe(200);
  expect(run.body.exitCode, run.body.stderr).toBe(0);
  return run.body.stdout.trim();
}

describe('exec user', () => {
  it("runs a sandbox's commands as its user, with its groups and home", async () => {
    const id = await sandbox({ user: 'alice' });
    expect(await out(id, 'id -u; id -g')).toBe('1000\n1000');
    expect((await out(id, 'id -G')).split(' ')).toEqual(expect.arrayContaining(['1000', '2000']));
    expect((await out(id, 'id -G')).split(' ')).not.toContain('0');
    expect(await out(id, 'echo $HOME')).toBe('/home/alice');
    expect(await out(id, 'echo $HOME', { env: { HOME: '/work' } })).toBe('/work');
    const denied = await exec(id, { cmd: 'touch /root/x' });
    expect(denied.body.exitCode).not.toBe(0);
    expect(denied.body.stderr).toMatch(/Permission denied/);
    // The exec's user overrides the sandbox's.
    expect(await out(id, 'id -u; id -g; echo $HOME; touch /root/x && echo ok', { user: '0' })).toBe('0\n0\n/root\nok');
    expect(await out(id, 'id -u; id -g; id -G; echo $HOME', { user: 'root' })).toBe('0\n0\n0\n/root');
  });

  it('takes uids without an entry, explicit groups, and refuses unknown names', async () => {
    const id = await sandbox();
    expect(await out(id, 'id -u; id -g; id -G; echo $HOME', { user: '1234' })).toBe('1234\n0\n0\n/');
    expect(await out(id, 'id -u; id -g', { user: '4321' })).toBe('4321\n0');
    expect(await out(id, 'id -u; id -g', { user: 'alice:2000' })).toBe('1000\n2000');
    expect(await out(id, 'id -u; id -g', { user: 'alice:dev' })).toBe('1000\n2000');
    expect(await out(id, 'id -u; id -g', { user: '1000:1234' })).toBe('1000\n1234');
    expect(await out(id, 'id -u; id -g; echo $HOME', { user: '1000' })).toBe('1000\n1000\n/home/alice');

    const unknown = await exec(id, { cmd: 'id', user: 'nobody-here' });
    expect(unknown.body).toMatchObject({ exitCode: 126, stdout: '' });
    expect(unknown.body.stderr).toBe('rollbox: cannot start command: unable to find user nobody-here: no matching entries in /etc/passwd\n');
    const noGroup = await exec(id, { cmd: 'id', user: 'alice:nogroup' });
    expect(noGroup.body).toMatchObject({ exitCode: 126 });
    expect(noGroup.body.stderr).toBe('rollbox: cannot start command: unable to find group nogroup: no matching entries in /etc/group\n');
    const outOfRange = await exec(id, { cmd: 'id', user: '99999999999' });
    expect(outOfRange.body).toMatchObject({ exitCode: 126 });
    expect(outOfRange.body.stderr).toMatch(/uids and gids must be in range/);

    for (const user of ['a b', '', ':1000', 'alice:', 'a:b:c', 'x'.repeat(65)]) {
      const bad = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd: 'id', user });
      expect(bad.status, user).toBe(400);
      expect(bad.body.error.code).toBe('invalid_request');
    }
    const badCreate = await api(cluster, token, 'POST', '/v1/sandboxes', { user: 'a b' });
    expect(badCreate.status).toBe(400);
  });

  it("keeps the sandbox's user when it comes from a warm pool and across a worker restart", async () => {
    const admin = await cluster.token('ops', ['admin']);
    const pool = { image: { base: 'busybox', layers: [accounts] }, size: 1, diskMiB: 64, resources: { memoryMiB: 64 } };
    expect((await api(cluster, admin, 'PUT', '/v1/pools/users', pool)).status).toBe(200);
    await waitFor('a ready sandbox in the pool', async () => (await api(cluster, admin, 'GET', '/v1/pools/users')).body.status?.ready === 1, 30_000);
    const pooled = await api(cluster, token, 'POST', '/v1/sandboxes', { image: pool.image, resources: { memoryMiB: 64, diskMiB: 64 }, user: 'alice' });
    expect(pooled.body.pool, JSON.stringify(pooled.body)).toBe('users');
    made.push(pooled.body.id);
    const cold = await sandbox({ user: 'alice' });
    expect(await api(cluster, admin, 'DELETE', '/v1/pools/users').then((r) => r.status)).toBe(204);
    for (const id of [pooled.body.id, cold]) expect(await out(id, 'id -u')).toBe('1000');
    // Adopted by a new worker process: the user comes back with the sandbox (the claim's, or the bundle's).
    await worker.stop({ destroySandboxes: false });
    worker = await cluster.addWorker({ nodeId: NODE });
    for (const id of [pooled.body.id, cold]) expect(await out(id, 'id -u; echo $HOME')).toBe('1000\n/home/alice');
  });

  it('runs as root without a user, and the files API stays root', async () => {
    const plain = await sandbox();
    expect(await out(plain, 'id -u; id -g; echo $HOME')).toBe('0\n0\n/root');

    const id = await sandbox({ user: 'alice' });
    const put = await api(cluster, token, 'PUT', `/v1/sandboxes/${id}/files?path=/root/from-api`, new Uint8Array(Buffer.from('secret\n')), { 'content-type': 'application/octet-stream' });
    expect(put.status, JSON.stringify(put.body)).toBe(200);
    const got = await fetch(`${cluster.url}/v1/sandboxes/${id}/files?path=/root/from-api`, { headers: { authorization: `Bearer ${token}` } });
    expect(await got.text()).toBe('secret\n');
    expect(await out(id, 'cat /root/from-api; stat -c %u /root/from-api', { user: '0' })).toBe('secret\n0');
    expect((await exec(id, { cmd: 'cat /root/from-api' })).body.exitCode).not.toBe(0);
  });
});
