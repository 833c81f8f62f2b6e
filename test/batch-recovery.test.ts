import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Batch, BatchResultLine, CommandRecord, NodeHeartbeat } from '../src/api/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

let cluster: TestCluster;

beforeAll(async () => {
  // This process's gateway takes the submit and runs no task (0 slots): two gateways of
  // their own do, and two worker hosts of their own run the sandboxes, so each can be SIGKILLed.
  cluster = await startTestCluster({ env: { ROLLBOX_BATCH_SLOTS: '0', ROLLBOX_HEARTBEAT_MS: '300', ROLLBOX_NODE_LOST_AFTER_MS: '2000' } });
});
afterAll(async () => {
  await cluster?.stop();
});

describe('when a gateway and a worker host are SIGKILLed', () => {
  it('loses no task, records each once, and runs no completed step again', async () => {
    const workers = [await cluster.spawnWorker({ nodeId: 'rec-w1' }), await cluster.spawnWorker({ nodeId: 'rec-w2' })];
    const admin = await cluster.token('ops', ['admin']);
    await waitFor('both worker hosts', async () => (await api<{ nodes: NodeHeartbeat[] }>(cluster, admin, 'GET', '/v1/nodes')).body.nodes?.filter((n) => n.healthy).length === 2, 30_000);
    const runnerEnv = { ROLLBOX_BATCH_SLOTS: '6', ROLLBOX_BATCH_LEASE_MS: '3000' };
    const gatewayA = await cluster.spawnGateway({ name: 'gw-a', env: runnerEnv });
    await cluster.spawnGateway({ name: 'gw-b', env: runnerEnv });
    const token = await cluster.token('recovery', ['batch:submit', 'sandbox:read']);

    const tasks = Array.from({ length: 60 }, (_, i) => ({ customId: `t${i}`, resources: { memoryMiB: 32, cpuMillis: 100 }, steps: [{ cmd: `sleep 0.3; echo done-${i}`, timeoutMs: 20_000 }] }));
    const batch = (await api<Batch>(cluster, token, 'POST', '/v1/batches', { tasks, maxConcurrency: 12, maxAttempts: 4 })).body;
    await waitFor('a dozen results', async () => (await api<Batch>(cluster, token, 'GET', `/v1/batches/${batch.id}`)).body.counts.succeeded >= 12, 60_000);
    gatewayA.child.kill('SIGKILL');
    workers[0]!.kill('SIGKILL');

    const done = await waitFor('the batch to end', async () => {
      const b = (await api<Batch>(cluster, token, 'GET', `/v1/batches/${batch.id}`)).body;
      return ['completed', 'cancelled', 'failed', 'expired'].includes(b.state) && b;
    }, 120_000);
    expect(done.state).toBe('completed');
    expect(done.counts).toMatchObject({ total: 60, succeeded: 60, infra_error: 0, queued: 0, running: 0 });
    const lines = (await (await fetch(`${cluster.url}/v1/batches/${batch.id}/results?limit=1000`, { headers: { authorization: `Bearer ${token}` } })).text())
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as BatchResultLine);
    expect(lines).toHaveLength(60);
    expect(new Set(lines.map((l) => l.customId)).size).toBe(60);
    for (const l of lines) expect(l.steps[0]!.stdout).toBe(`done-${l.customId.slice(1)}\n`);
    const retried = lines.filter((l) => l.attempts > 1);
    expect(retried.length).toBeGreaterThan(0);
    // A retried task's step completed (exit 0) in one sandbox at most, over all its attempts.
    const sandboxes = (await api<{ sandboxes: { id: string; spec: { labels: Record<string, string> } }[] }>(cluster, token, 'GET', `/v1/sandboxes?label=rollbox.batch=${batch.id}&limit=1000`)).body.sandboxes;
    for (const l of retried) {
      let completed = 0;
      for (const s of sandboxes.filter((x) => x.spec.labels['rollbox.task'] === l.customId)) {
        const log = (await api<{ commands: CommandRecord[] }>(cluster, token, 'GET', `/v1/sandboxes/${s.id}/commands`)).body.commands ?? [];
        completed += log.filter((c) => c.state === 'done' && c.result?.exitCode === 0).length;
      }
      expect(completed, `task ${l.customId}`).toBeLessThanOrEqual(1);
    }
  }, 240_000);

  it('places a create again when its worker host dies before the sandbox ran: every create under load answers 201', async () => {
    const workers = [await cluster.spawnWorker({ nodeId: 'rec-w3' }), await cluster.spawnWorker({ nodeId: 'rec-w4' })];
    const admin = await cluster.token('ops', ['admin']);
    await waitFor('both new worker hosts', async () => (await api<{ nodes: NodeHeartbeat[] }>(cluster, admin, 'GET', '/v1/nodes')).body.nodes?.filter((n) => n.healthy && ['rec-w3', 'rec-w4'].includes(n.nodeId)).length === 2, 30_000);
    const token = await cluster.token('creates', ['sandbox:create', 'sandbox:read', 'sandbox:delete']);
    const statuses: number[] = [];
    const ids: string[] = [];
    let next = 0;
    let killed = false;
    await Promise.all(
      Array.from({ length: 8 }, async () => {
        while (next < 60) {
          next++;
          const r = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 32, cpuMillis: 100 } });
          statuses.push(r.status);
          if (r.status === 201) ids.push(r.body.id);
          else process.stderr.write(`create: ${r.status} ${JSON.stringify(r.body)}\n`);
          if (!killed && statuses.length >= 10) {
            killed = true;
            workers[0]!.kill('SIGKILL');
          }
        }
      }),
    );
    expect(statuses.filter((s) => s !== 201)).toEqual([]);
    // Those answered well after the kill run on a live host.
    const after = await Promise.all(ids.slice(-20).map(async (id) => (await api(cluster, token, 'GET', `/v1/sandboxes/${id}`)).body));
    for (const s of after) expect({ id: s.id, state: s.state, deadHost: s.node === 'rec-w3' }).toEqual({ id: s.id, state: 'running', deadHost: false });
  }, 120_000);
});
