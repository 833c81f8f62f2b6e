import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NodeHeartbeat, RunResult, Sandbox } from '../src/api/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

/**
 * `POST /v1/run` travels with its create and is answered by the worker host once, with the
 * sandbox discarded: when that host dies while the command runs, the call still ends, in
 * one readable state (infra_error, node_lost), and the sandbox ends with it.
 */
let cluster: TestCluster;

beforeAll(async () => {
  cluster = await startTestCluster({ env: { ROLLBOX_HEARTBEAT_MS: '300', ROLLBOX_NODE_LOST_AFTER_MS: '2000' } });
});
afterAll(async () => {
  await cluster?.stop();
});

describe('a run whose worker host dies', () => {
  it('answers infra_error (node_lost) and its sandbox ends failed(lost)', async () => {
    const worker = await cluster.spawnWorker({ nodeId: 'run-w1' });
    const admin = await cluster.token('ops', ['admin']);
    await waitFor('the worker host', async () => (await api<{ nodes: NodeHeartbeat[] }>(cluster, admin, 'GET', '/v1/nodes')).body.nodes?.some((n) => n.healthy), 30_000);
    const token = await cluster.token('fn', ['sandbox:run', 'sandbox:read']);
    const ok = await api<RunResult>(cluster, token, 'POST', '/v1/run', { cmd: 'echo fine', resources: { memoryMiB: 32, diskMiB: 64 } });
    expect(ok.body).toMatchObject({ status: 'ok', stdout: 'fine\n' });

    const started = Date.now();
    const pending = api<RunResult>(cluster, token, 'POST', '/v1/run', { cmd: 'echo begun; sleep 30', timeoutMs: 60_000, resources: { memoryMiB: 32, diskMiB: 64 } });
    const running = await waitFor('the run sandbox running', async () => {
      const list = (await api<{ sandboxes: Sandbox[] }>(cluster, token, 'GET', '/v1/sandboxes?label=rollbox.run=true&state=running')).body.sandboxes;
      return list.find((s) => s.id !== ok.body.sandboxId);
    }, 30_000);
    worker.kill('SIGKILL');
    const lost = await pending;
    expect(lost.status).toBe(200);
    expect(lost.body, JSON.stringify(lost.body)).toMatchObject({ status: 'infra_error', exitCode: null, error: { code: 'node_lost' }, sandboxId: running.id });
    expect(Date.now() - started).toBeLessThan(30_000); // answered when the host was found lost, not at the command's end
    const ended = await waitFor('the sandbox to end', async () => {
      const s = (await api<Sandbox>(cluster, token, 'GET', `/v1/sandboxes/${running.id}`)).body;
      return (s.state === 'failed' || s.state === 'terminated') && s;
    }, 30_000);
    expect(ended).toMatchObject({ state: 'failed', failureReason: 'lost' });
  }, 90_000);
});
