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

describe('a batch when a gateway and a worker host are SIGKILLed', () => {
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
});
