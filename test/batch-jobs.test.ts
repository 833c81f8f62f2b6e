import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Batch, BatchResultLine, BatchTaskStatus } from '../src/api/index.ts';
import { jobQueueName, JOB_KEY_PREFIX } from '../src/queues/jobs/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

let cluster: TestCluster;
let redis: Redis;
let token: string;

/** Every key of the batch's BullMQ queue (SCAN on a test Redis: nothing else shares it). */
async function queueKeys(batchId: string): Promise<string[]> {
  const found: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await redis.scan(cursor, 'MATCH', `${JOB_KEY_PREFIX}:${jobQueueName('batch', batchId)}:*`, 'COUNT', 1000);
    found.push(...batch);
    cursor = next;
  } while (cursor !== '0');
  return found;
}

/** Connections to Redis now, of every gateway and worker host (and this test's). */
async function clients(): Promise<number> {
  return ((await redis.client('LIST')) as string).split('\n').filter(Boolean).length;
}

async function ended(id: string, t = token): Promise<Batch> {
  return waitFor('the batch to end', async () => {
    const b = (await api<Batch>(cluster, t, 'GET', `/v1/batches/${id}`)).body;
    return ['completed', 'cancelled', 'failed', 'expired'].includes(b.state) && b;
  }, 90_000);
}

async function results(id: string): Promise<BatchResultLine[]> {
  const text = await (await fetch(`${cluster.url}/v1/batches/${id}/results?limit=1000`, { headers: { authorization: `Bearer ${token}` } })).text();
  return text.split('\n').filter(Boolean).map((l) => JSON.parse(l) as BatchResultLine);
}

const task = (customId: string, cmd: string) => ({ customId, resources: { memoryMiB: 32, cpuMillis: 100 }, steps: [{ cmd, timeoutMs: 20_000 }] });

beforeAll(async () => {
  // Two live sandboxes per tenant, six batch slots: most creates meet the quota (backpressure).
  cluster = await startTestCluster({ workers: [{ nodeId: 'jobs-node', env: { ROLLBOX_NODE_MAX_STARTING: '8' } }], env: { ROLLBOX_BATCH_SLOTS: '6', ROLLBOX_TENANT_MAX_SANDBOXES: '2', ROLLBOX_HEARTBEAT_MS: '500' } });
  redis = new Redis(cluster.redisUrl);
  token = await cluster.token('jobs-team', ['batch:submit', 'sandbox:read']);
});
afterAll(async () => {
  redis?.disconnect();
  await cluster?.stop();
});

describe('batch tasks as BullMQ jobs', () => {
  it('waits out a full quota as delayed jobs, uncharged; honours maxConcurrency; removes the queue once recorded', async () => {
    const connectionsBefore = await clients();
    const tasks = Array.from({ length: 12 }, (_, i) => task(`q:${i}`, 'sleep 0.3; echo ok'));
    const submitted = (await api<Batch>(cluster, token, 'POST', '/v1/batches', { tasks, maxConcurrency: 4, maxAttempts: 1 })).body;
    const name = jobQueueName('batch', submitted.id);
    // BullMQ's global concurrency carries the batch's maxConcurrency; the events stream is capped.
    expect(await redis.hmget(`${JOB_KEY_PREFIX}:${name}:meta`, 'concurrency', 'opts.maxLenEvents')).toEqual(['4', '100']);
    // Seen queued: a place in the queue (0 is next).
    const statuses = await Promise.all(tasks.map((t) => api<BatchTaskStatus>(cluster, token, 'GET', `/v1/batches/${submitted.id}/tasks/${encodeURIComponent(t.customId)}`)));
    // (A job delayed by no room has no place in the wait list until it is due; the reads race the runner, so places may repeat.)
    const positions = statuses.map((s) => s.body.position).filter((p): p is number => p !== undefined);
    expect(positions.length).toBeGreaterThan(0);
    expect(positions.every((p) => p >= 0 && p < 12)).toBe(true);
    let maxRunning = 0;
    const watching = (async () => {
      for (;;) {
        const b = (await api<Batch>(cluster, token, 'GET', `/v1/batches/${submitted.id}`)).body;
        maxRunning = Math.max(maxRunning, b.counts.running);
        if (['completed', 'cancelled', 'failed', 'expired'].includes(b.state)) return;
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    const batch = await ended(submitted.id);
    await watching;
    expect(batch.state).toBe('completed');
    expect(batch.counts).toMatchObject({ total: 12, succeeded: 12, infra_error: 0, queued: 0, running: 0 });
    const lines = await results(submitted.id);
    expect(lines).toHaveLength(12);
    // maxAttempts 1, 4 fetched at once and 2 fit the quota: tasks that found no room ran later, never charged for it.
    expect(lines.map((l) => l.attempts)).toEqual(lines.map(() => 1));
    expect(maxRunning).toBeLessThanOrEqual(4);
    await waitFor('its queue removed', async () => (await queueKeys(submitted.id)).length === 0 && (await redis.sismember('rb:batches:active', submitted.id)) === 0, 10_000);
    // While it ran, the gateway held a Worker for it (a blocking connection of its own); done, none: no polling for a finished batch.
    await waitFor('its worker closed', async () => (await clients()) <= connectionsBefore, 10_000);
  }, 120_000);

  it('a duplicate customId in a later chunk of a streamed submit fails the batch: no job of it runs, its queue goes', async () => {
    const lines = Array.from({ length: 700 }, (_, i) => JSON.stringify(task(`d${i}`, 'echo ran')));
    lines.push(JSON.stringify(task('d3', 'echo ran')));
    const refused = await api(cluster, token, 'POST', '/v1/batches', `${lines.join('\n')}\n`, { 'content-type': 'application/x-ndjson' });
    expect(refused.status).toBe(400);
    expect(refused.body.error.message).toMatch(/customId d3 appears twice/);
    const id = /batch_[a-z0-9]+/.exec(refused.body.error.message)![0];
    const batch = (await api<Batch>(cluster, token, 'GET', `/v1/batches/${id}`)).body;
    expect(batch).toMatchObject({ state: 'failed', counts: { succeeded: 0, running: 0 } });
    await waitFor('its queue removed', async () => (await queueKeys(id)).length === 0, 10_000);
    expect(await results(id)).toEqual([]);
  }, 60_000);

  it('a cancelled batch drains its waiting jobs at once and ends with one line per task', async () => {
    const tasks = Array.from({ length: 30 }, (_, i) => task(`c${i}`, 'sleep 0.5'));
    const submitted = (await api<Batch>(cluster, token, 'POST', '/v1/batches', { tasks, maxConcurrency: 2 })).body;
    await waitFor('a result', async () => (await api<Batch>(cluster, token, 'GET', `/v1/batches/${submitted.id}`)).body.counts.succeeded >= 1, 30_000);
    await api(cluster, token, 'POST', `/v1/batches/${submitted.id}/cancel`);
    expect(await redis.llen(`${JOB_KEY_PREFIX}:${jobQueueName('batch', submitted.id)}:wait`)).toBe(0);
    const batch = await ended(submitted.id);
    expect(batch.state).toBe('cancelled');
    const lines = await results(submitted.id);
    expect(new Set(lines.map((l) => l.customId)).size).toBe(30);
    expect(lines).toHaveLength(30);
    await waitFor('its queue removed', async () => (await queueKeys(submitted.id)).length === 0, 10_000);
  }, 60_000);
});
