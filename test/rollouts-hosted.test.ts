import net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROLLOUT_TIME_PARTS, type Batch, type BatchResultLine, type JobRolloutTimes, type ModelCallRecord, type Rollout, type RolloutTimesMs, type Trajectory } from '../src/api/index.ts';
import { RollboxClient, RolloutsClient } from '../src/client/index.ts';
import { agentLayerTar } from './support/agent-layer.ts';
import { launchChromium, type Chromium } from './support/cdp.ts';
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
/** The upstream's delay before each answer in the SDK tests: the model's part of a rollout is at least this per call. */
const UPSTREAM_DELAY_MS = 200;
const SCREENSHOT = path.join(import.meta.dirname, 'artifacts', 'console-rollout-times.png');
let cluster: TestCluster;
let upstream: ScriptedUpstream;
let trainer: string;
let agentLayer: string;
/** A listener on every host address: what reaches it from the agent sandbox got past its wall. */
let hostListener: net.Server;
let hostListenerPort: number;
let hostConnections = 0;
/** Every result line of job-ro's rollouts, for the job's times. */
const endedLines: BatchResultLine[] = [];
let chromium: Chromium | undefined;

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
  await chromium?.close();
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
    if (text.trim()) {
      const line = JSON.parse(text.trim().split('\n')[0]!) as BatchResultLine;
      endedLines.push(line);
      return { batch: submitted.body, line };
    }
  }
  throw new Error(`rollout batch ${submitted.body.id} gave no result in 4 minutes`);
}

const agentImage = () => ({ base: 'busybox', layers: [agentLayer] });
const spanMs = (from: string, to: string) => Date.parse(to) - Date.parse(from);

/**
 * A rollout's times, as its result line and its record give them, against its trajectory: the
 * parts sum to the total, a sequential agent's model part is its calls' spans (held as they
 * say), the script's commands are in its tool part, its creates in its environment wait.
 */
async function expectConsistentTimes(line: BatchResultLine, trajectory: Trajectory): Promise<RolloutTimesMs> {
  const times = line.rollout!.timesMs!;
  expect(times, JSON.stringify(line.rollout)).toBeDefined();
  expect((await api<Rollout>(cluster, trainer, 'GET', `/v1/rollouts/${line.rollout!.id}`)).body.timesMs).toEqual(times);
  expect(ROLLOUT_TIME_PARTS.reduce((sum, part) => sum + times[part], 0)).toBe(times.total);
  for (const part of ROLLOUT_TIME_PARTS) expect(times[part], part).toBeGreaterThanOrEqual(0);
  const calls = trajectory.entries.flatMap((e) => (e.kind === 'model_call' ? [e.call] : []));
  const held = (c: ModelCallRecord) => Math.min(Math.round(c.heldMs), spanMs(c.receivedAt, c.endedAt));
  expect(times.modelUpstream + times.modelHeld).toBe(calls.reduce((sum, c) => sum + spanMs(c.receivedAt, c.endedAt), 0));
  expect(times.modelHeld).toBe(calls.reduce((sum, c) => sum + held(c), 0));
  const scripted = new Set(SCRIPT.flatMap((t) => (t.toolCalls ?? []).map((c) => String(c.arguments.cmd))));
  const toolSpans = trajectory.entries.flatMap((e) => (e.kind === 'command' && scripted.has(e.command.argv[2]!) ? [spanMs(e.command.queuedAt, e.command.endedAt!)] : []));
  expect(times.tool).toBeGreaterThanOrEqual(toolSpans.reduce((a, b) => a + b, 0));
  expect(times.envWait).toBeGreaterThan(0);
  expect(times.total).toBeGreaterThanOrEqual(line.agent!.durationMs);
  return times;
}

describe('hosted rollouts', () => {
  it.each([
    ['openai', chatTurn],
    ['anthropic', messagesTurn],
  ] as const)('runs an unchanged %s SDK agent in its own sandbox; its trajectory is the script, interleaved with its commands, and its times add up', async (sdk, turnOf) => {
    upstream.delayMs = UPSTREAM_DELAY_MS;
    const { line } = await runRollout({
      files: { 'bug.txt': Buffer.from('broken\n').toString('base64') },
      agent: { image: agentImage(), argv: ['/usr/bin/node', `/agent/${sdk}-agent.mjs`], env: { AGENT_STREAM: '1', AGENT_TASK: 'Fix bug.txt' }, resources: { memoryMiB: 512 }, timeoutMs: 150_000 },
      model: { job: 'job-ro' },
      grade: { mode: 'same-sandbox', cmd: 'grep -qx fixed bug.txt' },
    }).finally(() => (upstream.delayMs = 0));
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
    // Where its time went: each call waited on the upstream's delay at least, its commands ran.
    const times = await expectConsistentTimes(line, trajectory.body);
    expect(times.modelUpstream + times.modelHeld).toBeGreaterThanOrEqual(UPSTREAM_DELAY_MS * SCRIPT.length);
    expect(times.tool).toBeGreaterThan(0);

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
      // The held turn's wait is in the rollout's held time.
      const times = await expectConsistentTimes(line, trajectory);
      expect(times.modelHeld).toBeGreaterThan(0);
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

  it('sums its job\'s rollouts by how they ended and where their time went: API, Prometheus and the console chart (real Chromium) agree', async () => {
    // One more rollout that ends at its model-call limit: its agent's second call is refused.
    const { line: limited } = await runRollout({
      customId: 'limited',
      agent: { image: agentImage(), argv: ['/usr/bin/node', '/agent/openai-agent.mjs'], resources: { memoryMiB: 512 }, timeoutMs: 60_000 },
      model: { job: 'job-ro' },
      limits: { maxModelCalls: 1 },
    });
    expect(limited, JSON.stringify(limited)).toMatchObject({ status: 'failed', rollout: { modelCalls: 1, hit: 'max_model_calls' } });
    const expected = { ...Object.fromEntries(['succeeded', 'failed', 'timeout', 'limit', 'cancelled', 'infra_error'].map((k) => [k, 0])), succeeded: endedLines.length - 1, limit: 1 };
    const sums = Object.fromEntries([...ROLLOUT_TIME_PARTS, 'total'].map((part) => [part, endedLines.reduce((sum, l) => sum + l.rollout!.timesMs![part as keyof RolloutTimesMs], 0)]));
    // The job's counters are written as the result is recorded: they catch up within moments.
    const client = new RolloutsClient(new RollboxClient({ baseUrl: cluster.url, token: trainer }));
    const job = await waitFor('the job\'s counters', async () => {
      const j = await client.jobRolloutTimes('job-ro');
      return j.timed >= endedLines.length ? j : undefined;
    });
    expect(job).toEqual({ job: 'job-ro', ended: expected, completionRate: (endedLines.length - 1) / endedLines.length, timed: endedLines.length, timesMs: sums });
    // Another tenant's job of the same name is its own (empty).
    const other = await cluster.token('team-other', ['rollout:submit']);
    expect((await api<JobRolloutTimes>(cluster, other, 'GET', '/v1/jobs/job-ro/rollout-times')).body).toMatchObject({ timed: 0, completionRate: null });

    // Prometheus (one gateway here: its counters are the cluster's).
    const metrics = await (await fetch(`${cluster.url}/metrics`)).text();
    const metric = (name: string, label: string) => Number(metrics.split('\n').find((l) => l.startsWith(`${name}{`) && l.includes('tenant="team-ro",job="job-ro"') && l.includes(label))?.split(' ').at(-1));
    for (const part of ROLLOUT_TIME_PARTS) expect(metric('rollbox_rollout_seconds_total', `part="${part}"`), part).toBeCloseTo(sums[part]! / 1000, 3);
    expect(metric('rollbox_rollouts_ended_total', 'outcome="succeeded"')).toBe(expected.succeeded);
    expect(metric('rollbox_rollouts_ended_total', 'outcome="limit"')).toBe(1);

    // The console's chart: a bar per job, its parts' sums as the API gives them, the completion rate.
    const operator = await cluster.token('ops', ['cluster:read']);
    chromium = await launchChromium();
    const page = await chromium.newPage({ width: 1280, height: 1400 });
    await page.navigate(`${cluster.url}/ui/console#token=${encodeURIComponent(operator)}`);
    const row = 'document.querySelector(\'#rollout-jobs tr[data-rollout-job="team-ro/job-ro"]\')';
    await page.waitFor('the job\'s bar', `${row}?.dataset.timed === '${endedLines.length}'`, 30_000);
    const shown = await page.evaluate(`(() => {
      const row = ${row};
      const rects = [...row.querySelectorAll('rect[data-part]')];
      return {
        ms: Object.fromEntries(rects.map((r) => [r.dataset.part, Number(r.dataset.ms)])),
        widthSum: rects.reduce((sum, r) => sum + Number(r.getAttribute('width')), 0),
        completion: Number(row.querySelector('[data-col=completion]').dataset.value),
        text: row.textContent,
      };
    })()`);
    expect(shown.ms).toEqual(Object.fromEntries(ROLLOUT_TIME_PARTS.map((part) => [part, sums[part]])));
    expect(shown.widthSum).toBeCloseTo(100, 1);
    expect(shown.completion).toBe(job.completionRate);
    expect(shown.text).toContain(`${expected.succeeded} of ${endedLines.length} (1 limit)`);
    expect(shown.text).not.toMatch(/undefined|NaN/);
    expect(page.exceptions).toEqual([]);
    await page.evaluate(`document.getElementById('rollouts-section').scrollIntoView()`);
    expect((await page.screenshot(SCREENSHOT)).subarray(1, 4).toString()).toBe('PNG');
  }, 180_000);

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
