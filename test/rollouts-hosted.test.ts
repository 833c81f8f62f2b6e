import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Batch, BatchResultLine, Rollout, Trajectory } from '../src/api/index.ts';
import { agentLayerTar } from './support/agent-layer.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { chatTurn, messagesTurn } from './support/model-script.ts';
import { ScriptedUpstream, type ScriptTurn } from './support/model-upstream.ts';

// Hosted rollouts (issue 39 points 1-2): the agent loop runs in its own agent sandbox beside
// the task sandbox, an unchanged agent written against the official `openai` SDK, its model
// calls going through the gateway (recorded), its tools through the rollbox client into its
// task sandbox; the trajectory is the script; the agent sandbox reaches the gateway only.
const SECRET = 'sk-upstream-secret-hosted-0123456789';
const SCRIPT: ScriptTurn[] = [
  { text: 'Let me look at the bug.', toolCalls: [{ name: 'bash', arguments: { cmd: 'cat bug.txt' } }] },
  { toolCalls: [{ name: 'bash', arguments: { cmd: 'echo fixed > bug.txt' } }, { name: 'bash', arguments: { cmd: 'cat bug.txt' } }] },
  { text: 'The bug is fixed.' },
];
/** Holds answer fast here: keepalives, the early 200 of a call that does not stream, probes of a stopped upstream. */
const HOLD_ENV = { ROLLBOX_MODEL_KEEPALIVE_MS: '300', ROLLBOX_MODEL_EARLY_HEADERS_MS: '1000', ROLLBOX_MODEL_PROBE_MS: '200', ROLLBOX_MODEL_LEASE_MS: '1500' };
/** The agent SDK's own timeout in the preemption test: the trainer stays away twice as long. */
const AGENT_SDK_TIMEOUT_MS = 2500;
let cluster: TestCluster;
let upstream: ScriptedUpstream;
let trainer: string;
let agentLayer: string;
/** A listener on every host address: what reaches it from the agent sandbox got past its wall. */
let hostListener: net.Server;
let hostListenerPort: number;
let hostConnections = 0;

beforeAll(async () => {
  hostListener = net.createServer((s) => {
    hostConnections++;
    s.destroy();
  });
  await new Promise<void>((r) => hostListener.listen(0, '0.0.0.0', () => r()));
  hostListenerPort = (hostListener.address() as net.AddressInfo).port;
  [cluster, upstream] = await Promise.all([startTestCluster({ workers: [{ nodeId: 'node-ro1' }], env: HOLD_ENV }), ScriptedUpstream.start({ script: SCRIPT })]);
  trainer = await cluster.token('team-ro', ['rollout:submit', 'layer:write']);
  const put = await api(cluster, trainer, 'PUT', '/v1/jobs/job-ro/model', { upstreams: [{ baseUrl: upstream.url }], headers: { authorization: `Bearer ${SECRET}` } });
  expect(put.status, JSON.stringify(put.body)).toBe(200);
  const layer = await api(cluster, trainer, 'POST', '/v1/layers?name=test-agents', new Uint8Array(await agentLayerTar(['openai-agent', 'anthropic-agent'])), { 'content-type': 'application/x-tar' });
  expect(layer.status, JSON.stringify(layer.body)).toBe(201);
  agentLayer = layer.body.digest;
}, 240_000);
afterAll(async () => {
  await upstream?.stop();
  await cluster?.stop();
  hostListener?.close();
}, 60_000);

/** Submits one rollout and follows its batch to its result line. */
async function runRollout(task: object): Promise<{ batch: Batch; line: BatchResultLine }> {
  const submitted = await api<Batch>(cluster, trainer, 'POST', '/v1/rollouts', { task: { customId: 'r', ...task } });
  expect(submitted.status, JSON.stringify(submitted.body)).toBe(201);
  for (let polls = 0; polls < 4; polls++) {
    const results = await fetch(`${cluster.url}/v1/batches/${submitted.body.id}/results?waitSeconds=60`, { headers: { authorization: `Bearer ${trainer}` } });
    const text = await results.text();
    expect(results.status, text).toBe(200);
    if (text.trim()) return { batch: submitted.body, line: JSON.parse(text.trim().split('\n')[0]!) as BatchResultLine };
  }
  throw new Error(`rollout batch ${submitted.body.id} gave no result in 4 minutes`);
}

const agentImage = () => ({ base: 'busybox', layers: [agentLayer] });

describe('hosted rollouts', () => {
  it.each([
    ['openai', chatTurn],
    ['anthropic', messagesTurn],
  ] as const)('runs an unchanged %s SDK agent in its own sandbox; its trajectory is the script, interleaved with its commands', async (sdk, turnOf) => {
    const { line } = await runRollout({
      files: { 'bug.txt': Buffer.from('broken\n').toString('base64') },
      agent: { image: agentImage(), argv: ['/usr/bin/node', `/agent/${sdk}-agent.mjs`], env: { AGENT_STREAM: '1', AGENT_TASK: 'Fix bug.txt' }, resources: { memoryMiB: 512 }, timeoutMs: 150_000 },
      model: { job: 'job-ro' },
      grade: { mode: 'same-sandbox', cmd: 'grep -qx fixed bug.txt' },
    });
    expect(line, JSON.stringify(line)).toMatchObject({ status: 'succeeded', agent: { exitCode: 0 }, rollout: { modelCalls: SCRIPT.length }, grade: { passed: true } });
    expect(line.agent!.stdout).toContain('The bug is fixed.');
    const id = line.rollout!.id;

    const rollout = await api<Rollout>(cluster, trainer, 'GET', `/v1/rollouts/${id}`);
    expect(rollout.status).toBe(200);
    expect(rollout.body).toMatchObject({ id, tenant: 'team-ro', job: 'job-ro', task: { state: 'done', status: 'succeeded' }, usage: { modelCalls: SCRIPT.length } });

    const trajectory = await api<Trajectory>(cluster, trainer, 'GET', `/v1/rollouts/${id}/trajectory`);
    expect(trajectory.status).toBe(200);
    // The script's turns, each followed by the commands its tool calls ran; then the grade.
    const expected = SCRIPT.flatMap((turn, i) => [`model ${i}`, ...(turn.toolCalls ?? []).map((t) => `command ${String(t.arguments.cmd)}`)]);
    const commandOf = (argv: string[]) => (argv[0] === '/bin/sh' && argv[1] === '-c' ? argv[2]! : argv.join(' '));
    const seen = trajectory.body.entries.map((e) => (e.kind === 'model_call' ? `model ${e.call.turn - 1}` : `command ${commandOf(e.command.argv)}`));
    // After the agent's: the same-sandbox grade (its sweep of leftover processes, then its command).
    expect(seen.slice(0, expected.length)).toEqual(expected);
    expect(seen.at(-1)).toBe('command grep -qx fixed bug.txt');
    const calls = trajectory.body.entries.flatMap((e) => (e.kind === 'model_call' ? [e.call] : []));
    expect(calls.map((c) => c.status)).toEqual(SCRIPT.map(() => 200));
    expect(calls.map(turnOf)).toEqual(SCRIPT);
    expect(calls.every((c) => c.api === (sdk === 'openai' ? 'chat.completions' : 'messages'))).toBe(true);
    // The upstream got the trainer's credential; nothing the agent saw or sent held it.
    expect(upstream.received.every((r) => r.headers.authorization === `Bearer ${SECRET}`)).toBe(true);
    expect(JSON.stringify(trajectory.body)).not.toContain(SECRET);

    // Another tenant sees none of it.
    const other = await cluster.token('team-other', ['rollout:submit', 'batch:submit']);
    expect((await api(cluster, other, 'GET', `/v1/rollouts/${id}`)).status).toBe(404);
    expect((await api(cluster, other, 'GET', `/v1/rollouts/${id}/trajectory`)).status).toBe(404);
  }, 260_000);

  it('goes on through a preempted trainer: upstream gone for twice the SDK timeout, job paused, then back; the trajectory is an uninterrupted run', async () => {
    let preemption: Promise<{ pausedStates: string[] }> | undefined;
    const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
    const heldCalls = async () => (await api(cluster, trainer, 'GET', '/v1/jobs/job-ro/model')).body.hold.heldCalls as number;
    // The trainer dies as the second turn reaches its model: the upstream goes (this request
    // with it), the job is paused, and both come back after twice the agent SDK's timeout.
    upstream.onRequest = async (received) => {
      if (received.turn !== 1 || preemption) return;
      void upstream.stop();
      preemption = (async () => {
        await waitFor('the call held', async () => (await heldCalls()) >= 1);
        const paused = await api(cluster, trainer, 'POST', '/v1/jobs/job-ro/pause', {});
        expect(paused.status, JSON.stringify(paused.body)).toBe(200);
        await sleep(2 * AGENT_SDK_TIMEOUT_MS);
        await upstream.restart();
        expect((await api(cluster, trainer, 'POST', '/v1/jobs/job-ro/resume', {})).status).toBe(200);
        return { pausedStates: (paused.body.results as { state: string }[]).map((r) => r.state) };
      })();
    };
    try {
      const { line } = await runRollout({
        files: { 'bug.txt': Buffer.from('broken\n').toString('base64') },
        agent: { image: agentImage(), argv: ['/usr/bin/node', '/agent/openai-agent.mjs'], env: { AGENT_TIMEOUT_MS: String(AGENT_SDK_TIMEOUT_MS), AGENT_MAX_RETRIES: '2' }, resources: { memoryMiB: 512 }, timeoutMs: 150_000 },
        model: { job: 'job-ro' },
      });
      expect(preemption, 'the preemption happened').toBeDefined();
      // Both of the rollout's sandboxes (task and agent) were frozen while the trainer was away.
      expect((await preemption!).pausedStates).toEqual(['paused', 'paused']);
      expect(line, JSON.stringify(line)).toMatchObject({ status: 'succeeded', agent: { exitCode: 0 }, rollout: { modelCalls: SCRIPT.length } });
      const trajectory = (await api<Trajectory>(cluster, trainer, 'GET', `/v1/rollouts/${line.rollout!.id}/trajectory`)).body;
      const calls = trajectory.entries.flatMap((e) => (e.kind === 'model_call' ? [e.call] : []));
      // One record per turn, as the script: the held turn recorded once, however often the SDK retried.
      expect(calls.map((c) => c.turn)).toEqual([1, 2, 3]);
      expect(calls.map(chatTurn)).toEqual(SCRIPT);
      expect(calls[1]!.heldMs).toBeGreaterThan(0);
      const commands = trajectory.entries.flatMap((e) => (e.kind === 'command' ? [e.command.argv[2]] : []));
      expect(commands).toEqual(SCRIPT.flatMap((t) => (t.toolCalls ?? []).map((c) => c.arguments.cmd)));
    } finally {
      upstream.onRequest = undefined;
      await preemption?.catch(() => undefined);
    }
  }, 260_000);

  it('keeps the agent sandbox to the gateway and its rollout, and the upstream credential out of every sandbox', async () => {
    const gateway = 'http://gateway.rollbox.internal:9180';
    const probe = [
      'env',
      `wget -q -O- ${gateway}/healthz >/dev/null && echo GATEWAY_REACHED`,
      // Its key reads its task sandbox, and nothing of the tenant's beyond its rollout.
      `wget -q -O- --header "authorization: Bearer $ROLLBOX_API_KEY" ${gateway}/v1/sandboxes/$ROLLBOX_SANDBOX_ID >/dev/null && echo TASK_READ`,
      `wget -q -O- --header "authorization: Bearer $ROLLBOX_API_KEY" ${gateway}/v1/sandboxes >/dev/null || echo LIST_REFUSED`,
      `wget -q -O- --header "authorization: Bearer $ROLLBOX_API_KEY" ${gateway}/v1/jobs/job-ro/model >/dev/null || echo BINDING_REFUSED`,
      // Other ports of the host it reaches the gateway on, and the host's loopback.
      `wget -q -T 3 -O- http://gateway.rollbox.internal:${hostListenerPort}/ >/dev/null 2>&1 || echo HOST_PORT_BLOCKED`,
      `wget -q -T 3 -O- http://127.0.0.1:${hostListenerPort}/ >/dev/null 2>&1 || echo LOOPBACK_BLOCKED`,
      'true',
    ].join('; ');
    const { line } = await runRollout({
      steps: [{ cmd: `env; wget -q -T 3 -O- ${gateway}/healthz >/dev/null 2>&1 && echo TASK_REACHED_GATEWAY || echo TASK_CANNOT_REACH_GATEWAY` }],
      agent: { cmd: probe, timeoutMs: 60_000 },
      model: { job: 'job-ro' },
    });
    expect(line, JSON.stringify(line)).toMatchObject({ status: 'succeeded', rollout: { modelCalls: 0 } });
    const out = line.agent!.stdout;
    for (const word of ['GATEWAY_REACHED', 'TASK_READ', 'LIST_REFUSED', 'BINDING_REFUSED', 'HOST_PORT_BLOCKED', 'LOOPBACK_BLOCKED']) expect(out, out).toContain(word);
    expect(out).toMatch(/^ROLLBOX_API_KEY=rbr_/m);
    expect(out).toContain(`ROLLBOX_ROLLOUT_ID=${line.rollout!.id}`);
    expect(out + line.steps[0]!.stdout).not.toContain(SECRET);
    expect(line.steps[0]!.stdout).toContain('TASK_CANNOT_REACH_GATEWAY');
    expect(line.steps[0]!.stdout).not.toContain('rbr_');
    expect(hostConnections).toBe(0);
  }, 120_000);

  it('refuses a rollout without an agent, an agent without a model, and a batch:submit token alone', async () => {
    const noAgent = await api(cluster, trainer, 'POST', '/v1/rollouts', { task: { customId: 'x', steps: [{ cmd: 'true' }] } });
    expect(noAgent.status).toBe(400);
    expect(noAgent.body.error.message).toMatch(/agent/);
    const noModel = await api(cluster, trainer, 'POST', '/v1/rollouts', { task: { customId: 'x', agent: { cmd: 'true', timeoutMs: 1000 } } });
    expect(noModel.status).toBe(400);
    const batchOnly = await cluster.token('team-ro', ['batch:submit']);
    const task = { customId: 'x', agent: { cmd: 'true', timeoutMs: 1000 }, model: { job: 'job-ro' } };
    expect((await api(cluster, batchOnly, 'POST', '/v1/rollouts', { task })).status).toBe(403);
    expect((await api(cluster, batchOnly, 'POST', '/v1/batches', { tasks: [task] })).status).toBe(403);
  });
});
