import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutKeyStore } from '../src/iam/index.ts';
import { api, startTestCluster, type TestCluster } from './support/cluster.ts';

// A hosted rollout's key reaches its own sandboxes and the model routes, and nothing else.
let cluster: TestCluster;
let redis: Redis;
let keys: RolloutKeyStore;
let owner: string;
let granted: string;
let other: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-rk' }] });
  redis = new Redis(cluster.redisUrl);
  keys = new RolloutKeyStore(redis);
  owner = await cluster.token('team-rk', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
  const create = async () => (await api(cluster, owner, 'POST', '/v1/sandboxes', { job: 'job-rk' })).body.id as string;
  [granted, other] = await Promise.all([create(), create()]);
});
afterAll(async () => {
  for (const id of [granted, other]) if (id) await api(cluster, owner, 'DELETE', `/v1/sandboxes/${id}`);
  redis?.disconnect();
  await cluster?.stop();
});

describe('rollout keys', () => {
  it('run commands and move files in a granted sandbox, by Bearer', async () => {
    const key = await keys.issue({ tenant: 'team-rk', rolloutId: 'ro-1', job: 'job-rk', ttlSeconds: 60 });
    expect(key).toMatch(/^rbr_[0-9a-f]{40}$/);
    await keys.grantSandbox('ro-1', granted, 60);
    const ran = await api(cluster, key, 'POST', `/v1/sandboxes/${granted}/exec`, { cmd: 'echo hi > /root/f; cat /root/f' });
    expect(ran.status).toBe(200);
    expect(ran.body.stdout).toBe('hi\n');
    expect((await api(cluster, key, 'GET', `/v1/sandboxes/${granted}`)).status).toBe(200);
    expect((await api(cluster, key, 'GET', `/v1/sandboxes/${granted}/commands`)).status).toBe(200);
    const file = await fetch(`${cluster.url}/v1/sandboxes/${granted}/files?path=/root/f`, { headers: { authorization: `Bearer ${key}` } });
    expect(await file.text()).toBe('hi\n');
  });

  it('reach no other sandbox of the same tenant, and nothing beyond the allowlist', async () => {
    const key = await keys.issue({ tenant: 'team-rk', rolloutId: 'ro-2', job: 'job-rk', ttlSeconds: 60 });
    await keys.grantSandbox('ro-2', granted, 60);
    for (const [method, path, body] of [
      ['POST', `/v1/sandboxes/${other}/exec`, { cmd: 'true' }],
      ['GET', `/v1/sandboxes/${other}`, undefined],
      ['GET', `/v1/sandboxes/${other}/files?path=/etc/hostname`, undefined],
      ['GET', '/v1/rollouts/ro-1', undefined],
    ] as const) {
      const res = await api(cluster, key, method, path, body);
      expect(res.status, `${method} ${path}`).toBe(404);
    }
    for (const [method, path, body] of [
      ['GET', '/v1/sandboxes', undefined],
      ['POST', '/v1/sandboxes', { job: 'job-rk' }],
      ['DELETE', `/v1/sandboxes/${granted}`, undefined],
      ['POST', `/v1/sandboxes/${granted}/pause`, {}],
      ['POST', `/v1/sandboxes/${granted}/snapshot`, {}],
      ['POST', `/v1/sandboxes/${granted}/fork`, { count: 1 }],
      ['PATCH', `/v1/sandboxes/${granted}/policy`, { network: { mode: 'none' } }],
      ['POST', '/v1/jobs/job-rk/pause', {}],
      ['GET', '/v1/layers', undefined],
      ['POST', '/v1/run', { cmd: 'true' }],
      ['GET', '/v1/batches', undefined],
    ] as const) {
      const res = await api(cluster, key, method, path, body);
      expect(res.status, `${method} ${path}`).toBe(403);
      expect(res.body.error.code).toBe('forbidden');
    }
  });

  it('come as x-api-key too, and stop working once revoked', async () => {
    const key = await keys.issue({ tenant: 'team-rk', rolloutId: 'ro-3', job: 'job-rk', ttlSeconds: 60 });
    await keys.grantSandbox('ro-3', granted, 60);
    const viaApiKey = await api(cluster, undefined, 'GET', `/v1/sandboxes/${granted}`, undefined, { 'x-api-key': key });
    expect(viaApiKey.status).toBe(200);
    await keys.revoke('ro-3');
    // Other gateways may trust their cache for ROLLOUT_KEY_CACHE_MS; this store's own cache is cleared at once,
    // and the gateway's lapses within that time.
    await new Promise((r) => setTimeout(r, 2100));
    const after = await api(cluster, key, 'GET', `/v1/sandboxes/${granted}`);
    expect(after.status).toBe(401);
    expect(after.body.error.code).toBe('unauthenticated');
    expect((await api(cluster, 'rbr_' + '0'.repeat(40), 'GET', `/v1/sandboxes/${granted}`)).status).toBe(401);
  });

  it('leave ordinary tokens as they were', async () => {
    expect((await api(cluster, owner, 'GET', `/v1/sandboxes/${other}`)).status).toBe(200);
    expect((await api(cluster, owner, 'GET', '/v1/sandboxes')).status).toBe(200);
  });
});
