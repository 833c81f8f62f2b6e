import { Queue } from 'bullmq';
import { afterEach, describe, expect, it } from 'vitest';
import { ERROR_CODES, type Scope } from '../src/api/index.ts';
import { JOB_KEY_PREFIX, connectJobRedis, createQueueName } from '../src/queues/jobs/index.ts';
import { REFUSING_NODE_ENV, api, nodesUp, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { hostTraces } from './support/host.ts';

const SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'admin'];

let cluster: TestCluster | undefined;
afterEach(async () => {
  await cluster?.stop();
  if (cluster) expect(hostTraces(cluster.rootDir)).toEqual({ mounts: [], loops: [], containers: [] });
  cluster = undefined;
});


/** Reads a node's create queue as an operator's tooling would. */
async function withQueue<T>(c: TestCluster, nodeId: string, fn: (queue: Queue) => Promise<T>): Promise<T> {
  const connection = connectJobRedis(c.redisUrl);
  const queue = new Queue(createQueueName(nodeId), { connection, prefix: JOB_KEY_PREFIX });
  try {
    return await fn(queue);
  } finally {
    await queue.close();
    await connection.quit();
  }
}

describe('creates as BullMQ jobs', () => {
  it("adds a create to its node's queue under an id derived from the sandbox id, once per request", async () => {
    cluster = await startTestCluster({ workers: [{ nodeId: 'node-q' }] });
    const token = await cluster.token('jobs', SCOPES);
    const first = await api(cluster, token, 'POST', '/v1/sandboxes', {}, { 'idempotency-key': 'k-1' });
    expect(first.status).toBe(201);
    const again = await api(cluster, token, 'POST', '/v1/sandboxes', {}, { 'idempotency-key': 'k-1' });
    expect(again.body.id).toBe(first.body.id);
    await withQueue(cluster, 'node-q', async (queue) => {
      const job = await queue.getJob(`${first.body.id}.0`);
      expect(job?.data).toMatchObject({ sandboxId: first.body.id, attempt: 0 });
      expect(await job?.getState()).toBe('completed');
      expect(await queue.getJobCounts('completed', 'failed', 'wait', 'active')).toEqual({ completed: 1, failed: 0, wait: 0, active: 0 });
    });
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${first.body.id}`);
  });

  it('a refusal completes its job on the refusing host (no retry there) and the create goes to the next node', async () => {
    cluster = await startTestCluster({ workers: [{ nodeId: 'cj-full', env: REFUSING_NODE_ENV }, { nodeId: 'cj-free' }] });
    const token = await cluster.token('jobs', SCOPES);
    await nodesUp(cluster, token, 2);
    const created = await Promise.all(Array.from({ length: 6 }, () => api(cluster!, token, 'POST', '/v1/sandboxes', {})));
    expect(created.map((r) => [r.status, r.body.node])).toEqual(Array(6).fill([201, 'cj-free']));
    const refusedIds = await withQueue(cluster, 'cj-full', async (queue) => {
      const jobs = await queue.getJobs(['completed', 'failed', 'wait', 'active', 'delayed']);
      for (const job of jobs) {
        expect(await job.getState()).toBe('completed');
        expect(job.attemptsMade).toBe(1);
      }
      return jobs.map((j) => j.id!);
    });
    // Each create the full node refused was sent once more, to the free node, as the next attempt.
    await withQueue(cluster, 'cj-free', async (queue) => {
      for (const id of refusedIds) {
        const [sandboxId, attempt] = id.split('.');
        expect(await queue.getJob(`${sandboxId}.${Number(attempt) + 1}`)).toBeTruthy();
      }
    });
    await Promise.all(created.map((r) => api(cluster!, token, 'DELETE', `/v1/sandboxes/${r.body.id}`)));
  });

  it('a worker host SIGKILLed mid-create and restarted: every create ends once, 201 or a coded error', async () => {
    cluster = await startTestCluster({ workers: [{ nodeId: 'cj-live' }] });
    const token = await cluster.token('jobs', SCOPES);
    const doomed = await cluster.spawnWorker({ nodeId: 'cj-doomed' });
    await nodesUp(cluster, token, 2);
    const creates = Promise.all(Array.from({ length: 16 }, () => api(cluster!, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 } })));
    await new Promise((r) => setTimeout(r, 150));
    doomed.kill('SIGKILL');
    await new Promise((r) => setTimeout(r, 1000));
    const restarted = await cluster.spawnWorker({ nodeId: 'cj-doomed' });
    const answers = await creates;
    for (const a of answers) {
      if (a.status === 201) expect(a.body.state).toBe('running');
      else expect(Object.keys(ERROR_CODES)).toContain(a.body.error?.code);
    }
    const ok = answers.filter((a) => a.status === 201);
    expect(ok.length).toBeGreaterThan(0);
    // Nothing is left half made, and no request made two running sandboxes.
    const all = await waitFor('every sandbox settled', async () => {
      const list = (await api(cluster!, token, 'GET', '/v1/sandboxes?limit=1000')).body.sandboxes as { id: string; state: string }[];
      return list.every((s) => s.state !== 'pending' && s.state !== 'creating') && list;
    }, 30_000);
    const running = all.filter((s) => s.state === 'running').map((s) => s.id);
    expect(running.sort()).toEqual(ok.map((a) => a.body.id).sort());
    // The kill hit creates in flight: some reached cj-live only as a later attempt (placed again).
    const replaced = await withQueue(cluster, 'cj-live', async (queue) => (await queue.getJobs(['completed'])).filter((j) => Number(j.id!.split('.')[1]) > 0));
    expect(replaced.length + answers.filter((a) => a.body.node === 'cj-doomed' || a.status !== 201).length).toBeGreaterThan(0);
    await Promise.all(running.map((id) => api(cluster!, token, 'DELETE', `/v1/sandboxes/${id}`)));
    restarted.kill('SIGKILL');
  });
});
