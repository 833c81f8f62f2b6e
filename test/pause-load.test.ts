import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { JobActionResult, Scope } from '../src/api/index.ts';
import { api, startTestCluster, type TestCluster } from './support/cluster.ts';
import { hostTraces } from './support/host.ts';

/**
 * A pause on a busy host (issue 38 point 9): 32 sandboxes of one job paused at once while
 * others burn the host's CPU and write to its disk. Each ends paused, or refused with a
 * coded, retryable answer (the sandbox running on as it was); a retry pauses it. Never a 500,
 * never a sandbox left half frozen.
 */
const SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete'];
const SMALL = { cpuMillis: 100, memoryMiB: 32 };
const RETRYABLE = new Set(['unavailable', 'timeout', 'node_lost']);
let cluster: TestCluster;
let token: string;

beforeAll(async () => {
  // Heartbeats are late on a host this busy: the node is not declared lost for them.
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-busy' }], env: { ROLLBOX_NODE_LOST_AFTER_MS: '15000' } });
  token = await cluster.token('busy-tenant', SCOPES);
}, 60_000);
afterAll(async () => {
  await cluster?.stop();
  expect(hostTraces(cluster.rootDir)).toEqual({ mounts: [], loops: [], containers: [] });
});

const create = async (job: string) => {
  const r = await api(cluster, token, 'POST', '/v1/sandboxes', { job, resources: SMALL });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body.id as string;
};

describe('pause under load', () => {
  it('pauses 32 sandboxes at once on a host kept busy: each paused or refused retryably, and a retry pauses it', async () => {
    // The load: CPU spinners and a disk writer, in sandboxes of another job.
    const hogs = await Promise.all(Array.from({ length: 4 }, () => create('hogs')));
    for (const [i, id] of hogs.entries()) {
      const cmd = i === 0 ? 'while :; do dd if=/dev/zero of=/root/x bs=1M count=64 conv=fsync 2>/dev/null; done' : 'while :; do :; done';
      expect((await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, background: true })).status).toBe(202);
    }
    const ids: string[] = [];
    for (let i = 0; i < 32; i += 8) ids.push(...(await Promise.all(Array.from({ length: 8 }, () => create('paused-job')))));
    // Each sandbox of the job runs a process of its own that the freeze must stop.
    await Promise.all(ids.map((id) => api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd: 'while :; do :; done', background: true })));

    const first = await api<JobActionResult>(cluster, token, 'POST', '/v1/jobs/paused-job/pause', { mode: 'freeze' });
    expect(first.status, JSON.stringify(first.body)).toBe(200);
    expect(first.body.results.map((r) => r.id).sort()).toEqual([...ids].sort());
    const refused = first.body.results.filter((r) => r.outcome === 'failed');
    for (const r of first.body.results) {
      if (r.outcome === 'failed') expect(RETRYABLE.has(r.error!.code), JSON.stringify(r)).toBe(true);
      else expect(r.state).toBe('paused');
    }
    // A refused sandbox runs on as it was; the retry pauses what is left.
    for (const r of refused) expect(['running', 'paused']).toContain((await api(cluster, token, 'GET', `/v1/sandboxes/${r.id}`)).body.state);
    const again = await api<JobActionResult>(cluster, token, 'POST', '/v1/jobs/paused-job/pause', { mode: 'freeze' });
    expect(again.body.results.filter((r) => r.outcome === 'failed' && !RETRYABLE.has(r.error!.code))).toEqual([]);
    const states = await Promise.all(ids.map(async (id) => (await api(cluster, token, 'GET', `/v1/sandboxes/${id}`)).body.state as string));
    expect(states.filter((s) => s !== 'paused').length, `${refused.length} refused at first, then ${JSON.stringify(again.body.results.filter((r) => r.outcome === 'failed'))}`).toBe(0);

    // One pause by its own route on the busy host: paused, or a coded 503 with Retry-After.
    await api(cluster, token, 'POST', '/v1/jobs/paused-job/resume', {});
    const one = await api(cluster, token, 'POST', `/v1/sandboxes/${ids[0]}/pause`, { mode: 'freeze' });
    if (one.status !== 200) expect([one.status, one.body.error.code, one.headers.get('retry-after') !== null]).toEqual([503, 'unavailable', true]);
    else expect(one.body.state).toBe('paused');
    await Promise.all([...ids, ...hogs].map((id) => api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)));
  }, 240_000);
});
