import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

let cluster: TestCluster;
let token: string;

beforeAll(async () => {
  // 1 GiB of scratch space, no overcommit: the node promises at most ~1024 MiB of diskMiB.
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-disk', env: { ROLLBOX_NODE_SCRATCH_GIB: '1', ROLLBOX_NODE_DISK_OVERCOMMIT: '1' } }] });
  token = await cluster.token('disk', ['sandbox:create', 'sandbox:read', 'sandbox:delete', 'admin']);
  await waitFor('heartbeat with disk capacity', async () => (await api(cluster, token, 'GET', '/v1/nodes')).body.nodes?.[0]?.capacity.diskMiB === 1024);
});
afterAll(async () => cluster?.stop());

const create = (diskMiB: number) => api(cluster, token, 'POST', '/v1/sandboxes', { resources: { diskMiB, memoryMiB: 32 } });

describe('disk admission', () => {
  it('places and admits diskMiB against the scratch space, like memory', async () => {
    const tooBig = await create(2048);
    expect(tooBig.status).toBe(503);
    expect(tooBig.body.error.message).toContain('2048 MiB of disk');

    // Both are placed before a heartbeat shows either: the node admits one and refuses the other.
    const pair = await Promise.all([create(600), create(600)]);
    expect(pair.map((r) => r.status).sort()).toEqual([201, 503]);
    const running = pair.find((r) => r.status === 201)!.body;
    const refused = pair.find((r) => r.status === 503)!.body;
    expect(['admission_exhausted', 'no_capacity']).toContain(refused.error.code);

    const fits = await create(200); // 600 + 200 still fits
    expect(fits.status, JSON.stringify(fits.body)).toBe(201);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${running.id}`);
    // Released disk is promised again.
    await waitFor('released disk reported', async () => (await api(cluster, token, 'GET', '/v1/nodes')).body.nodes[0].used.diskMiB === 200);
    const again = await create(600);
    expect(again.status, JSON.stringify(again.body)).toBe(201);
    await Promise.all([fits, again].map((r) => api(cluster, token, 'DELETE', `/v1/sandboxes/${r.body.id}`)));
  });
});
