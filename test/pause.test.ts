import fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Scope } from '../src/api/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { hostTraces } from './support/host.ts';

const SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'admin'];
let cluster: TestCluster;
let token: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-p1' }, { nodeId: 'node-p2' }] });
  token = await cluster.token('pauser', SCOPES);
  await waitFor('two nodes', async () => (await api(cluster, token, 'GET', '/v1/nodes')).body.nodes?.length === 2);
});
afterAll(async () => cluster?.stop());

const exec = (id: string, body: object) => api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, body);

describe('pause and resume (freeze)', () => {
  it('stops CPU time while frozen, refuses exec with 409, and keeps files and processes', async () => {
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    await exec(sandbox.id, { cmd: 'echo kept > /root/file' });
    const started = await exec(sandbox.id, { cmd: "sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $!" });
    const pid = started.body.stdout.trim();
    // CPU time the sandbox used, read on the host from its cpuacct cgroup (ns), and whether
    // its freezer says it is frozen.
    const cgroup = (controller: string, file: string) => `/sys/fs/cgroup/${controller}/rollbox/${sandbox.node}/rb-${sandbox.id}/${file}`;
    const cpuNs = () => Number(fs.readFileSync(cgroup('cpuacct', 'cpuacct.usage'), 'utf8'));
    const spinning = (since: number) => waitFor('the busy loop to use CPU', async () => cpuNs() > since + 20e6, 60_000);
    await spinning(cpuNs());

    const paused = await api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/pause`, { mode: 'freeze' });
    expect(paused.body.state).toBe('paused');
    expect(fs.readFileSync(cgroup('freezer', 'freezer.state'), 'utf8').trim()).toBe('FROZEN');
    // Frozen: the busy loop gets no CPU at all, however long one looks (here: across a
    // refused exec and half a second): an observation window, not a wait for something to happen.
    const frozenAt = cpuNs();
    const refused = await exec(sandbox.id, { argv: ['true'] });
    expect(refused.status).toBe(409);
    expect(refused.body.error.code).toBe('invalid_state');
    await new Promise((r) => setTimeout(r, 500));
    expect(cpuNs() - frozenAt).toBeLessThan(1e6);
    const resumed = await api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/resume`, {});
    expect(resumed.body.state).toBe('running');
    await spinning(cpuNs());

    expect((await exec(sandbox.id, { cmd: `cat /root/file; kill -0 ${pid} && echo alive` })).body.stdout).toBe('kept\nalive\n');
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/resume`, {})).body.state).toBe('running'); // idempotent
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandbox.id}`);
  });

  it('pauses and resumes every sandbox of a training job across worker hosts in one call', async () => {
    const created = await Promise.all(Array.from({ length: 6 }, () => api(cluster, token, 'POST', '/v1/sandboxes', { job: 'train-1', resources: { memoryMiB: 64 } })));
    const other = await api(cluster, token, 'POST', '/v1/sandboxes', { job: 'train-2' });
    expect(new Set(created.map((r) => r.body.node))).toEqual(new Set(['node-p1', 'node-p2']));

    const paused = await api(cluster, token, 'POST', '/v1/jobs/train-1/pause', {});
    expect(paused.status).toBe(200);
    expect(paused.body.results).toHaveLength(6);
    expect(paused.body.results.every((r: { outcome: string; state: string }) => r.outcome === 'done' && r.state === 'paused')).toBe(true);
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${other.body.id}`)).body.state).toBe('running');
    const again = await api(cluster, token, 'POST', '/v1/jobs/train-1/pause', {});
    expect(again.body.results.map((r: { outcome: string }) => r.outcome)).toEqual(Array(6).fill('unchanged'));

    const resumed = await api(cluster, token, 'POST', '/v1/jobs/train-1/resume', {});
    expect(resumed.body.results.every((r: { state: string }) => r.state === 'running')).toBe(true);
    for (const r of created) expect((await exec(r.body.id, { argv: ['echo', 'back'] })).body.stdout).toBe('back\n');
    await Promise.all([...created, other].map((r) => api(cluster, token, 'DELETE', `/v1/sandboxes/${r.body.id}`)));
  });

  it('hibernates: packs the files, frees the container, and wakes with the same file tree', async () => {
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    await exec(sandbox.id, { cmd: 'mkdir -p /work && echo state > /work/a && rm /bin/vi && echo more >> /etc/passwd && sleep 1000 >/dev/null 2>&1 &' });
    const treeHash = 'cd / && find work etc bin root -xdev | sort | md5sum && find work etc root -xdev -type f -exec md5sum {} + | sort | md5sum';
    const before = (await exec(sandbox.id, { cmd: treeHash })).body.stdout;

    const hibernated = await api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/pause`, { mode: 'hibernate' });
    expect(hibernated.status, JSON.stringify(hibernated.body)).toBe(200);
    expect(hibernated.body.state).toBe('hibernated');
    // No container, so no memory held: its processes are gone.
    expect(hostTraces(cluster.rootDir).containers).not.toContain(`rb-${sandbox.id}`);
    expect((await exec(sandbox.id, { argv: ['true'] })).status).toBe(409);

    const woken = await api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/resume`, {});
    expect(woken.status, JSON.stringify(woken.body)).toBe(200);
    expect(woken.body).toMatchObject({ id: sandbox.id, state: 'running' });
    expect((await exec(sandbox.id, { cmd: treeHash })).body.stdout).toBe(before);
    // Processes restart from scratch after hibernation (documented).
    expect((await exec(sandbox.id, { cmd: 'ps -o args | grep "[s]leep 1000" || echo none' })).body.stdout).toBe('none\n');
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandbox.id}`);
  });

  it('ends a hibernated sandbox at its TTL with failed(timeout)', async () => {
    // A TTL well past the time hibernating takes on a loaded host (it packs the writable
    // layer): the sandbox must reach hibernated before its TTL ends.
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', { ttlSeconds: 6 });
    const paused = await api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/pause`, { mode: 'hibernate' });
    expect(paused.body.state, JSON.stringify(paused.body)).toBe('hibernated');
    const ended = await waitFor('ttl while hibernated', async () => {
      const s = await api(cluster, token, 'GET', `/v1/sandboxes/${sandbox.id}`);
      return s.body.state === 'failed' ? s.body : undefined;
    }, 30_000);
    expect(ended).toMatchObject({ failureReason: 'timeout', detail: 'ttl expired while hibernated' });
  });
});
