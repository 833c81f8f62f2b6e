import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { Scope } from '../src/api/index.ts';
import { REFUSING_NODE_ENV, RESTART_TOLERANT_ENV, api, nodesUp, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { hostTraces } from './support/host.ts';

const SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'admin'];
let cluster: TestCluster | undefined;
afterEach(async () => {
  await cluster?.stop();
  if (cluster) expect(hostTraces(cluster.rootDir)).toEqual({ mounts: [], loops: [], containers: [] });
  cluster = undefined;
});



describe('two worker hosts', () => {
  it('spreads sandboxes over both nodes', async () => {
    cluster = await startTestCluster({ workers: [{ nodeId: 'node-1' }, { nodeId: 'node-2' }] });
    const token = await cluster.token('t', SCOPES);
    await nodesUp(cluster, token, 2);
    const created = await Promise.all(Array.from({ length: 10 }, () => api(cluster!, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 } })));
    expect(created.map((r) => r.status)).toEqual(Array(10).fill(201));
    const perNode = new Map<string, number>();
    for (const r of created) perNode.set(r.body.node, (perNode.get(r.body.node) ?? 0) + 1);
    expect(perNode.get('node-1')).toBeGreaterThanOrEqual(3);
    expect(perNode.get('node-2')).toBeGreaterThanOrEqual(3);
  });

  it('re-places work a node refuses, and fails clearly with Retry-After when every node refuses', async () => {
    cluster = await startTestCluster({ workers: [{ nodeId: 'node-full', env: REFUSING_NODE_ENV }, { nodeId: 'node-free' }] });
    const token = await cluster.token('t', SCOPES);
    await nodesUp(cluster, token, 2);
    const created = await Promise.all(Array.from({ length: 6 }, () => api(cluster!, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 } })));
    expect(created.map((r) => [r.status, r.body.node])).toEqual(Array(6).fill([201, 'node-free']));
    await Promise.all(created.map((r) => api(cluster!, token, 'DELETE', `/v1/sandboxes/${r.body.id}`)));
    await cluster.stop();

    cluster = await startTestCluster({ workers: [{ nodeId: 'node-full-1', env: REFUSING_NODE_ENV }, { nodeId: 'node-full-2', env: REFUSING_NODE_ENV }] });
    const token2 = await cluster.token('t', SCOPES);
    await nodesUp(cluster, token2, 2);
    const refused = await api(cluster, token2, 'POST', '/v1/sandboxes', {});
    expect(refused.status).toBe(503);
    expect(refused.body.error.code).toBe('admission_exhausted');
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThan(0);
    const failed = await api(cluster, token2, 'GET', '/v1/sandboxes?state=failed');
    expect(failed.body.sandboxes).toHaveLength(1);
    expect(failed.body.sandboxes[0].failureReason).toBe('admission_exhausted');
  });

  it('marks a SIGKILLed host’s sandboxes failed(lost), sends new work to the live host, and a restart reaps the leftovers', async () => {
    cluster = await startTestCluster();
    const token = await cluster.token('t', SCOPES);
    const child = await cluster.spawnWorker({ nodeId: 'node-doomed' });
    await nodesUp(cluster, token, 1);
    const doomed = await Promise.all([1, 2].map(() => api(cluster!, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 } })));
    expect(doomed.map((r) => r.body.node)).toEqual(['node-doomed', 'node-doomed']);

    await cluster.addWorker({ nodeId: 'node-live' });
    await nodesUp(cluster, token, 2);
    child.kill('SIGKILL');
    for (const r of doomed) {
      await waitFor('failed(lost)', async () => {
        const s = await api(cluster!, token, 'GET', `/v1/sandboxes/${r.body.id}`);
        return s.body.state === 'failed' && s.body.failureReason === 'lost';
      });
    }
    const fresh = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    expect(fresh.body.node).toBe('node-live');
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${doomed[0]!.body.id}/exec`, { argv: ['true'] })).status).toBe(409);

    // The killed host's containers outlived it; a worker restarted on its data dir removes them.
    const doomedDir = path.join(cluster.rootDir, 'node-doomed');
    expect(hostTraces(doomedDir).containers.length).toBe(2);
    const restarted = await cluster.addWorker({ nodeId: 'node-doomed' });
    expect(hostTraces(doomedDir)).toEqual({ mounts: [], loops: [], containers: [] });
    await restarted.stop({ destroySandboxes: true });
  });

  it('keeps working across a Redis restart (sandboxes, queues, replies)', async () => {
    cluster = await startTestCluster({ workers: [{ nodeId: 'node-x' }] });
    const token = await cluster.token('t', SCOPES);
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    await api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/exec`, { cmd: 'echo before > /root/f' });
    await cluster.restartRedis();
    const read = await waitFor('exec after the restart', async () => {
      const r = await api(cluster!, token, 'POST', `/v1/sandboxes/${sandbox.id}/exec`, { cmd: 'cat /root/f', timeoutMs: 5000 });
      return r.status === 200 ? r : undefined;
    }, 30_000);
    expect(read.body.stdout).toBe('before\n');
    const fresh = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    expect(fresh.status).toBe(201);
  });

  it('a worker restarted with live sandboxes adopts them', async () => {
    const c = await startTestCluster({ env: RESTART_TOLERANT_ENV });
    cluster = c;
    const token = await c.token('t', SCOPES);
    const first = await c.addWorker({ nodeId: 'node-r' });
    await nodesUp(cluster, token, 1);
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    const exec = (body: object) => api(c, token, 'POST', `/v1/sandboxes/${sandbox.id}/exec`, body);
    await exec({ cmd: 'echo kept > /root/state; sleep 301 >/dev/null 2>&1 &' });
    // A command still running when the worker goes runs on: the next worker collects it.
    expect((await exec({ cmd: 'sleep 302', background: true, commandId: 'running-at-restart' })).status).toBe(202);
    const initPid = async () => (await exec({ cmd: 'cat /proc/1/stat' })).body.stdout.split(' ').slice(0, 2).join(' ');
    const before = await initPid();
    await first.stop({ destroySandboxes: false });

    await cluster.addWorker({ nodeId: 'node-r' });
    // The same container and init, reached again through its socket.
    const read = await exec({ cmd: 'cat /root/state; ps -o args' });
    expect(JSON.stringify(read.body)).toMatch(/"stdout":"kept\\n/);
    expect(await initPid()).toBe(before);
    expect(before).toMatch(/^1 \(init\)$/);
    expect(read.body.stdout).toContain('sleep 301'); // a daemon outlives the restart
    expect(read.body.stdout).toContain('sleep 302'); // so does a running command
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${sandbox.id}/commands/running-at-restart`)).body.state).toBe('running');
    // The new worker holds it: a signal by its id reaches it, and its real end is recorded.
    await waitFor('the collected command to take a signal', async () => (await api(c, token, 'POST', `/v1/sandboxes/${sandbox.id}/commands/running-at-restart/signal`, { signal: 'KILL' })).status === 200);
    const settled = await waitFor('running-at-restart done', async () => {
      const s = await api(c, token, 'GET', `/v1/sandboxes/${sandbox.id}/commands/running-at-restart`);
      return s.body.state === 'done' ? s.body : undefined;
    });
    expect(settled.result.exitCode).toBe(137);
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${sandbox.id}`)).body.state).toBe('running');
  });
});
