import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ERROR_CODES, type Batch, type Scope, type Trajectory } from '../src/api/index.ts';
import { keys } from '../src/registry/index.ts';
import { modelKeys } from '../src/model-gateway/keys.ts';
import { ScriptedUpstream } from './support/model-upstream.ts';
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
const SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'batch:submit', 'rollout:submit'];
/** Every request ends within this (a hang fails the test). */
const REQUEST_DEADLINE_MS = 45_000;

let cluster: TestCluster;
let token: string;

beforeAll(async () => {
  // A create's own bound (ROLLBOX_CREATE_TIMEOUT_MS, 60 s by default) well inside the test's deadline: a create
  // that meets the failover on a loaded machine ends coded `timeout` then (a full CI run saw one wait past 45 s).
  cluster = await startTestCluster({ redisCluster: true, workers: [{ nodeId: 'rcf-f', env: { ROLLBOX_NODE_MAX_STARTING: '8' } }], env: { ROLLBOX_BATCH_SLOTS: '4', ROLLBOX_CREATE_TIMEOUT_MS: '20000' } });
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

  it('a hosted rollout goes on through the failover of the primary holding its model calls: every call and command it was answered is recorded, once', async () => {
    const TURNS = 6;
    const upstream = await ScriptedUpstream.start({ script: Array.from({ length: TURNS }, (_, i) => ({ text: `turn ${i + 1}` })) });
    try {
      expect((await api(cluster, token, 'PUT', '/v1/jobs/job-fo/model', { upstreams: [{ baseUrl: upstream.url }] })).status).toBe(200);
      // A busybox agent: each turn a model call then a command in its task sandbox, each retried
      // (same body, same commandId) while Redis fails over; a model call retried says so, as the SDKs do.
      // (No `-T`: this busybox's wget segfaults with it on a POST.)
      const agent = [
        'post() { for try in $(seq 0 30); do wget -q -O- --header "Content-Type: application/json" --header "authorization: Bearer $ROLLBOX_API_KEY" --header "x-stainless-retry-count: $try" --post-data "$2" "$1" 2>/tmp/err && return 0; cat /tmp/err >&2; sleep 1; done; return 1; }',
        'm=\'{"role":"user","content":"go"}\'',
        `for i in $(seq 1 ${TURNS}); do`,
        '  post "$OPENAI_BASE_URL/chat/completions" "{\\"model\\":\\"m\\",\\"messages\\":[$m]}" >/dev/null || exit 11',
        '  post "$ROLLBOX_URL/v1/sandboxes/$ROLLBOX_SANDBOX_ID/exec" "{\\"cmd\\":\\"echo turn-$i\\",\\"commandId\\":\\"turn-$i\\"}" >/dev/null || exit 12',
        '  m="$m,{\\"role\\":\\"assistant\\",\\"content\\":\\"a$i\\"}"',
        'done',
      ].join('\n');
      const task = { customId: 'r', resources: { memoryMiB: 32 }, agent: { cmd: agent, resources: { memoryMiB: 32 }, timeoutMs: 120_000 }, model: { job: 'job-fo' } };
      // The primary of the rollout's slot (its calls in flight, records, log) must have a replica: the first test's victim's shard has none left.
      const nodes = await cluster.redisCluster!.nodes();
      const probe = new Redis(cluster.redisCluster!.ports.find((p) => nodes.some((n) => n.port === p && !n.failed))!, '127.0.0.1');
      let picked: { batch: Batch; victim: (typeof nodes)[number] } | undefined;
      upstream.delayMs = 2000; // no call ends before the pick
      try {
        for (let i = 0; !picked && i < 10; i++) {
          const batch = (await api<Batch>(cluster, token, 'POST', '/v1/rollouts', { task })).body;
          const slot = await probe.cluster('KEYSLOT', modelKeys.log(`${batch.id}.r.1`));
          const primary = nodes.find((n) => n.role === 'primary' && !n.failed && n.slots?.some(([from, to]) => slot >= from && slot <= to));
          if (primary && nodes.some((n) => n.role === 'replica' && !n.failed && n.primaryPort === primary.port)) picked = { batch, victim: primary };
          else await api(cluster, token, 'POST', `/v1/batches/${batch.id}/cancel`, {});
        }
      } finally {
        probe.disconnect();
      }
      expect(picked, JSON.stringify(nodes)).toBeDefined();
      upstream.delayMs = 300;
      // Killed with the third call upstream.
      await waitFor('two turns done', async () => upstream.received.filter((r) => r.turn === 2).length > 0, 60_000).catch(async (err: Error) => {
        const rollout = (await api(cluster, token, 'GET', `/v1/rollouts/${picked!.batch.id}.r.1`)).body;
        const agentCommand = (await api(cluster, token, 'GET', `/v1/sandboxes/${rollout.agentSandboxId}/commands/${picked!.batch.id}.1.agent`)).body;
        throw new Error(`${err.message}: ${JSON.stringify({ upstreamTurns: upstream.received.map((r) => r.turn), rollout, agentCommand })}`);
      });
      await cluster.redisCluster!.kill(picked!.victim.port, 'SIGKILL');

      const { lines } = await allBatchResults(cluster, token, picked!.batch.id, 5);
      expect(lines).toHaveLength(1);
      expect(lines[0], JSON.stringify(lines[0])).toMatchObject({ status: 'succeeded', agent: { exitCode: 0 }, rollout: { id: `${picked!.batch.id}.r.1`, modelCalls: TURNS } });
      const trajectory = await waitFor('the trajectory readable', async () => {
        const r = await api<Trajectory>(cluster, token, 'GET', `/v1/rollouts/${lines[0]!.rollout!.id}/trajectory`);
        return r.status === 200 && r.body;
      }, 30_000);
      const calls = trajectory.entries.flatMap((e) => (e.kind === 'model_call' ? [e.call] : []));
      expect(calls.map((c) => [c.turn, c.status])).toEqual(Array.from({ length: TURNS }, (_, i) => [i + 1, 200]));
      expect(trajectory.entries.flatMap((e) => (e.kind === 'command' ? [e.command.commandId] : []))).toEqual(Array.from({ length: TURNS }, (_, i) => `turn-${i + 1}`));
    } finally {
      await upstream.stop();
    }
  }, 180_000);
});
