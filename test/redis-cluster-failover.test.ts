import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ERROR_CODES, type Batch, type Scope } from '../src/api/index.ts';
import { keys } from '../src/registry/index.ts';
import { api, startTestCluster, waitFor, type ApiResponse, type TestCluster } from './support/cluster.ts';
import { allBatchResults } from './support/batches.ts';
import { hostTraces } from './support/host.ts';

/**
 * A Redis Cluster primary SIGKILLed under load (creates, execs, a batch): its replica
 * takes over, what was acknowledged survives, what was in flight ends in a coded error or
 * succeeds, and nothing hangs. Replication is asynchronous (rollbox issues no WAIT): on
 * loopback a replica is a fraction of a millisecond behind, which this test shows is
 * enough in practice, not a guarantee (docs/operations.md, Redis Cluster).
 */
const SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'batch:submit'];
/** Every request ends within this (a hang fails the test). */
const REQUEST_DEADLINE_MS = 45_000;

let cluster: TestCluster;
let token: string;

beforeAll(async () => {
  cluster = await startTestCluster({ redisCluster: true, workers: [{ nodeId: 'node-f', env: { ROLLBOX_NODE_MAX_STARTING: '8' } }], env: { ROLLBOX_BATCH_SLOTS: '4' } });
  token = await cluster.token('failover', SCOPES);
}, 120_000);

afterAll(async () => {
  await cluster?.stop();
  expect(hostTraces(cluster.rootDir)).toEqual({ mounts: [], loops: [], containers: [] });
});

interface Outcome {
  what: string;
  response?: ApiResponse;
  error?: string;
}

/** A request with a deadline: a hang is a thrown error, not a stuck test. */
async function timed(what: string, method: string, path: string, body?: unknown): Promise<Outcome> {
  const deadline = new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`${what} did not end within ${REQUEST_DEADLINE_MS} ms`)), REQUEST_DEADLINE_MS).unref());
  try {
    return { what, response: await Promise.race([api(cluster, token, method, path, body), deadline]) };
  } catch (err) {
    return { what, error: String(err) };
  }
}

const ended = (o: Outcome) => o.response !== undefined && (o.response.status < 300 || o.response.body?.error?.code in ERROR_CODES);

describe('a Redis Cluster primary killed under load', () => {
  it('fails over to its replica; acknowledged sandboxes, commands and batch results survive; in-flight requests end', async () => {
    const sandboxes = await Promise.all(Array.from({ length: 3 }, async () => (await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 } })).body.id as string));
    const batch = (await api<Batch>(cluster, token, 'POST', '/v1/batches', { tasks: Array.from({ length: 12 }, (_, i) => ({ customId: `t${i}`, resources: { memoryMiB: 32 }, steps: [{ cmd: 'sleep 0.5; echo done' }] })) })).body;
    expect(batch.id).toBeTruthy();

    // The primary of the first sandbox's slot: its record, commands and command log live there.
    const probe = new Redis(cluster.redisCluster!.ports[0]!, '127.0.0.1');
    const slot = await probe.cluster('KEYSLOT', keys.sandbox(sandboxes[0]!));
    probe.disconnect();
    const before = await cluster.redisCluster!.nodes();
    const victim = before.find((n) => n.role === 'primary' && n.slots?.some(([from, to]) => slot >= from && slot <= to));
    expect(victim, JSON.stringify(before)).toBeTruthy();

    const outcomes: Outcome[] = [];
    const acknowledgedExecs: { sandboxId: string; commandId: string }[] = [];
    const acknowledgedCreates: string[] = [];
    let stop = false;
    let seq = 0;
    const execLoop = async (sandboxId: string) => {
      while (!stop) {
        const commandId = `c${seq++}`;
        const o = await timed(`exec ${commandId}`, 'POST', `/v1/sandboxes/${sandboxId}/exec`, { cmd: `echo ${commandId} >> /root/log; echo ${commandId}`, commandId, timeoutMs: 10_000 });
        outcomes.push(o);
        if (o.response?.status === 200) acknowledgedExecs.push({ sandboxId, commandId });
        else await new Promise((r) => setTimeout(r, 100));
      }
    };
    const createLoop = async () => {
      while (!stop) {
        const o = await timed('create', 'POST', '/v1/sandboxes', { resources: { memoryMiB: 32 } });
        outcomes.push(o);
        if (o.response?.status === 201) acknowledgedCreates.push(o.response.body.id);
        else await new Promise((r) => setTimeout(r, 200));
      }
    };
    const load = Promise.all([...sandboxes.map(execLoop), createLoop()]);
    await new Promise((r) => setTimeout(r, 1500));
    const killedAtMs = Date.now();
    await cluster.redisCluster!.kill(victim!.port, 'SIGKILL');
    // The replica takes the slots over (cluster-node-timeout 1.5 s here).
    const promoted = await waitFor('a replica promoted', async () => {
      const now = await cluster.redisCluster!.nodes().catch(() => []);
      return now.find((n) => n.role === 'primary' && !n.failed && n.port !== victim!.port && n.slots?.some(([from, to]) => slot >= from && slot <= to));
    }, 30_000);
    expect(promoted.port).not.toBe(victim!.port);
    // Load goes on until requests succeed again on the promoted replica.
    await waitFor('execs answered after the failover', async () => outcomes.slice(-6).filter((o) => o.response?.status === 200).length >= 3, 60_000);
    const recoveredMs = Date.now() - killedAtMs;
    stop = true;
    await load;

    // Every request ended, with a result or a coded error.
    const hung = outcomes.filter((o) => !ended(o));
    expect(hung.map((o) => `${o.what}: ${o.error ?? `${o.response?.status} ${JSON.stringify(o.response?.body)}`}`)).toEqual([]);
    expect(acknowledgedExecs.length).toBeGreaterThan(10);

    // What was acknowledged is still there, and no command ran twice.
    for (const id of acknowledgedCreates) expect((await api(cluster, token, 'GET', `/v1/sandboxes/${id}`)).status).toBe(200);
    for (const sandboxId of sandboxes) {
      // Read once the cluster has settled: a call may still meet the failover's tail (a coded, retryable error).
      const { log } = await waitFor(`sandbox ${sandboxId} answering`, async () => {
        const read = (await api(cluster, token, 'POST', `/v1/sandboxes/${sandboxId}/exec`, { cmd: 'cat /root/log' })).body;
        return typeof read.stdout === 'string' ? { log: read.stdout as string } : undefined;
      }, 60_000);
      const lines = log.split('\n').filter(Boolean);
      expect(lines.length).toBe(new Set(lines).size);
      for (const { commandId } of acknowledgedExecs.filter((e) => e.sandboxId === sandboxId)) {
        expect(lines).toContain(commandId);
        const record = (await api(cluster, token, 'GET', `/v1/sandboxes/${sandboxId}/commands/${commandId}`)).body;
        expect(record).toMatchObject({ state: 'done', result: { exitCode: 0, stdout: `${commandId}\n` } });
      }
    }
    // The batch ends with exactly one result line per task.
    const results = (await allBatchResults(cluster, token, batch.id, 2)).lines;
    expect(results.map((l) => l.customId).sort()).toEqual(Array.from({ length: 12 }, (_, i) => `t${i}`).sort());
    console.log(JSON.stringify({ requests: outcomes.length, acknowledgedExecs: acknowledgedExecs.length, acknowledgedCreates: acknowledgedCreates.length, codedErrors: outcomes.filter((o) => (o.response?.status ?? 0) >= 300).map((o) => o.response!.body.error.code), recoveredMs, batch: results.map((l) => l.status) }));

    for (const id of [...sandboxes, ...acknowledgedCreates]) await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
  }, 300_000);
});
