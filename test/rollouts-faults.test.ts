import type { ChildProcess } from 'node:child_process';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Batch, FollowedRollout, ModelCallRecord} from '../src/api/index.ts';
import { RollboxClient, RolloutsClient } from '../src/client/index.ts';
import { inHostOrder } from '../src/workers/network/gateway-reach.ts';
import { agentLayerTar } from './support/agent-layer.ts';
import { api, spawnReadyWorker, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { chatTurn } from './support/model-script.ts';
import { ScriptedUpstream, type ScriptTurn } from './support/model-upstream.ts';
import { dnatTargetOf } from './support/gateway-dnat.ts';
import { startTcpFailover } from './support/tcp-failover.ts';

// Hosted rollouts survive their parts (issue 39 point 7, and the trainer's restart of point 6):
// several rollouts of an unchanged `openai` SDK agent run while the gateway serving their model
// calls is SIGKILLed mid-call (the worker host's relay sends the SDK's retry to the other
// gateway, which takes the call over), then the worker host is SIGKILLed and restarted (the
// agents' commands go on), while a trainer follows: one over server-sent events through a
// front of both gateways (its stream cut with the first), one the `rollbox` CLI, SIGKILLed
// after its first rollout and restarted from its cursor. Every rollout ends once, its
// trajectory the script, no call or command recorded twice, each delivered once.
const REPO_ROOT = path.resolve(import.meta.dirname, '..');
const JOB = 'job-faults';
const NODE = 'node-faults';
const ROLLOUTS = 3;
const SCRIPT: ScriptTurn[] = [
  ...Array.from({ length: 4 }, (_, i) => ({ text: `Step ${i}.`, toolCalls: [{ name: 'bash', arguments: { cmd: `echo step-${i} >> steps.txt` } }] })),
  { text: 'All steps done.' },
];
/** The upstream's answer time: calls are in flight when a part dies. */
const UPSTREAM_DELAY_MS = 500;
/** Short leases: a dead gateway's model calls and batch tasks are taken over within a few seconds. */
const CLUSTER_ENV = {
  ROLLBOX_BATCH_SLOTS: '0',
  ROLLBOX_MODEL_LEASE_MS: '1000',
  ROLLBOX_MODEL_PROBE_MS: '200',
  ROLLBOX_MODEL_KEEPALIVE_MS: '300',
  ROLLBOX_HEARTBEAT_MS: '300',
  // A restarted worker host comes back before its node is declared lost (which would retry its tasks afresh).
  ROLLBOX_NODE_LOST_AFTER_MS: '30000',
};
const RUNNER_ENV = { ROLLBOX_BATCH_SLOTS: '4', ROLLBOX_BATCH_LEASE_MS: '3000' };

let cluster: TestCluster;
let upstream: ScriptedUpstream;
let token: string;
let agentLayer: string;
let gateways: { child: ChildProcess; url: string }[];
let worker: ChildProcess;
let workerEnv: Record<string, string>;
const children: ChildProcess[] = [];

async function startWorker(): Promise<void> {
  worker = await spawnReadyWorker(cluster, { nodeId: NODE, env: workerEnv });
}

beforeAll(async () => {
  const layerTar = agentLayerTar(['openai-agent']);
  [cluster, upstream] = await Promise.all([startTestCluster({ env: CLUSTER_ENV }), ScriptedUpstream.start({ script: SCRIPT })]);
  // Two gateways of their own (this process's takes the trainer's calls and runs no task): each runs batch tasks and serves model calls.
  gateways = await Promise.all([cluster.spawnGateway({ name: 'gw-a', env: RUNNER_ENV }), cluster.spawnGateway({ name: 'gw-b', env: RUNNER_ENV })]);
  // The worker host sends its agent sandboxes to both: gw-a first (this node id's order, inHostOrder), gw-b when gw-a dies.
  workerEnv = { ROLLBOX_SANDBOX_GATEWAY_URL: gateways.map((g) => g.url).join(',') };
  await startWorker();
  token = await cluster.token('team-faults', ['rollout:submit', 'batch:submit', 'layer:write', 'sandbox:read']);
  expect((await api(cluster, token, 'PUT', `/v1/jobs/${JOB}/model`, { upstreams: [{ baseUrl: upstream.url }] })).status).toBe(200);
  const layer = await api(cluster, token, 'POST', '/v1/layers?name=fault-agents', new Uint8Array(await layerTar), { 'content-type': 'application/x-tar' });
  expect(layer.status, JSON.stringify(layer.body)).toBe(201);
  agentLayer = layer.body.digest;
}, 240_000);
afterAll(async () => {
  for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  await upstream?.stop();
  await cluster?.stop();
}, 120_000);

/** `rollbox rollout follow` as the trainer's own process: its NDJSON lines as they come. */
function cliFollower(batchId: string, after?: string): { child: ChildProcess; lines: FollowedRollout[]; exited: Promise<number | null>; stderr: () => string } {
  const child = spawn(process.execPath, [path.join(REPO_ROOT, 'bin/rollbox.js'), 'rollout', 'follow', batchId, ...(after ? ['--after', after] : [])], {
    env: { ...process.env, ROLLBOX_URL: cluster.url, ROLLBOX_TOKEN: token },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  const lines: FollowedRollout[] = [];
  let buffer = '';
  let stderr = '';
  child.stdout!.on('data', (d: Buffer) => {
    buffer += d.toString();
    for (let nl = buffer.indexOf('\n'); nl >= 0; nl = buffer.indexOf('\n')) {
      lines.push(JSON.parse(buffer.slice(0, nl)) as FollowedRollout);
      buffer = buffer.slice(nl + 1);
    }
  });
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  return { child, lines, exited: new Promise((resolve) => child.once('close', resolve)), stderr: () => stderr };
}

/** Where a stuck run stands: the upstream's requests, the batch, each agent's command so far. */
async function diagnose(batchId: string): Promise<string> {
  const sandboxes = (await api<{ sandboxes: { id: string; state: string; spec: { labels: Record<string, string> } }[] }>(cluster, token, 'GET', `/v1/sandboxes?label=rollbox.batch=${batchId}&limit=100`)).body.sandboxes ?? [];
  const agents = await Promise.all(
    sandboxes.filter((s) => s.spec.labels['rollbox.role'] === 'agent').map(async (s) => ({ id: s.id, state: s.state, command: (await api(cluster, token, 'GET', `/v1/sandboxes/${s.id}/commands`)).body })),
  );
  return JSON.stringify({ upstreamRequests: upstream.received.length, batch: (await api(cluster, token, 'GET', `/v1/batches/${batchId}`)).body, sandboxes: sandboxes.map((s) => [s.id, s.state, s.spec.labels]), agents });
}

const hostPort = (url: string) => ({ host: new URL(url).hostname, port: Number(new URL(url).port) });

describe('hosted rollouts through their parts\' deaths', () => {
  it('a gateway SIGKILLed mid-call, the worker host SIGKILLed and restarted, a trainer killed and restarted: every rollout ends once, its trajectory the script', async () => {
    const tasks = Array.from({ length: ROLLOUTS }, (_, i) => ({
      customId: `r${i}`,
      resources: { memoryMiB: 64, cpuMillis: 200 },
      agent: { image: { base: 'busybox', layers: [agentLayer] }, argv: ['/usr/bin/node', '/agent/openai-agent.mjs'], env: { AGENT_STREAM: '1', AGENT_TIMEOUT_MS: '60000' }, resources: { memoryMiB: 384 }, timeoutMs: 400_000 },
      model: { job: JOB },
    }));
    upstream.delayMs = UPSTREAM_DELAY_MS;
    const batch = (await api<Batch>(cluster, token, 'POST', '/v1/batches', { tasks, maxConcurrency: ROLLOUTS })).body;
    expect(batch.id, JSON.stringify(batch)).toBeTruthy();

    // A trainer following over SSE through a front of both gateways: its stream dies with gw-a and resumes on gw-b from its Last-Event-ID.
    const front = await startTcpFailover(() => gateways.map((g) => hostPort(g.url)));
    const streamed: FollowedRollout[] = [];
    const streaming = (async () => {
      for await (const followed of new RolloutsClient(new RollboxClient({ baseUrl: front.url, token })).streamRollouts(batch.id)) streamed.push(followed);
    })();
    // A trainer as its own process, following the NDJSON results.
    let cli = cliFollower(batch.id);

    try {
      // gw-a serves every call (the host's first gateway while it answers): it dies with a call of the first turns in flight.
      const killedAt = { requests: 0, reached: undefined as number | undefined };
      upstream.onRequest = async () => {
        if (upstream.received.length < ROLLOUTS + 2 || killedAt.requests) return;
        killedAt.requests = upstream.received.length;
        killedAt.reached = dnatTargetOf(NODE)?.port;
        gateways[0]!.child.kill('SIGKILL');
      };
      await waitFor('gw-a SIGKILLed mid-call', async () => killedAt.requests > 0, 240_000).catch(async (err: Error) => {
        throw new Error(`${err.message}: ${await diagnose(batch.id)}`);
      });
      upstream.onRequest = undefined;
      expect(killedAt.reached).toBe(hostPort(gateways[0]!.url).port);
      expect(inHostOrder(gateways, NODE)[0]).toBe(gateways[0]);
      // The agents go on through gw-b; then their worker host dies, with calls and commands in flight, and comes back.
      await waitFor('the rollouts moving through gw-b', async () => upstream.received.length >= killedAt.requests + ROLLOUTS, 180_000);
      const exited = new Promise((resolve) => worker.once('exit', resolve));
      worker.kill('SIGKILL');
      await exited;
      await startWorker();

      // The CLI trainer dies once it has taken a rollout in; restarted from that rollout's cursor.
      await waitFor('the CLI follower\'s first rollout', async () => cli.lines.length >= 1, 240_000);
      cli.child.kill('SIGKILL');
      await cli.exited;
      const taken = [...cli.lines];
      cli = cliFollower(batch.id, taken.at(-1)!.line.cursor);
      expect(await cli.exited, cli.stderr()).toBe(0);
      taken.push(...cli.lines);
      await streaming;

      const done = (await api<Batch>(cluster, token, 'GET', `/v1/batches/${batch.id}`)).body;
      const failed = streamed.filter((t) => t.line.status !== 'succeeded').map((t) => ({ ...t.line, trajectory: t.trajectory?.entries.map((e) => (e.kind === 'model_call' ? { turn: e.call.turn, attempts: e.call.attempts } : e.command.argv.at(-1))) }));
      expect(done, JSON.stringify(failed)).toMatchObject({ state: 'completed', counts: { total: ROLLOUTS, succeeded: ROLLOUTS, queued: 0, running: 0 } });
      const ids = tasks.map((t) => t.customId).sort();
      // Each trainer got each rollout once.
      expect(taken.map((t) => t.line.customId).sort()).toEqual(ids);
      expect(streamed.map((t) => t.line.customId).sort()).toEqual(ids);

      const calls: ModelCallRecord[] = [];
      for (const { line, trajectory } of streamed) {
        // A task whose runner died with gw-a counts that attempt, but its agent went on: the first attempt's rollout, never started afresh.
        expect(line, JSON.stringify(line)).toMatchObject({ status: 'succeeded', agent: { exitCode: 0 }, rollout: { id: `${batch.id}.${line.customId}.1`, modelCalls: SCRIPT.length } });
        expect(line.agent!.stdout).toContain('All steps done.');
        const own = trajectory!.entries.flatMap((e) => (e.kind === 'model_call' ? [e.call] : []));
        // One record per turn, as the script, whichever gateway took it.
        expect(own.map((c) => c.turn)).toEqual(SCRIPT.map((_, i) => i + 1));
        expect(own.map(chatTurn)).toEqual(SCRIPT);
        calls.push(...own);
        // Each tool call ran once, in the order of the script.
        const commands = trajectory!.entries.flatMap((e) => (e.kind === 'command' ? [e.command.argv.at(-1)] : []));
        expect(commands).toEqual(SCRIPT.flatMap((t) => (t.toolCalls ?? []).map((c) => c.arguments.cmd)));
        // The CLI's copy is the same rollout.
        expect(taken.find((t) => t.line.customId === line.customId)!.trajectory!.entries.length).toBe(trajectory!.entries.length);
      }
      // The events stream resumed from the first rollout's id (a follower reconnecting with Last-Event-ID): the others, once, with their trajectories, then the end.
      const resumed = await fetch(`${cluster.url}/v1/batches/${batch.id}/events?trajectory=true`, { headers: { authorization: `Bearer ${token}`, 'last-event-id': streamed[0]!.line.cursor } });
      const events = [...(await resumed.text()).matchAll(/^event: (\w+)\ndata: (.*)\n(?:id: (.*)\n)?/gm)].map((m) => ({ event: m[1]!, data: JSON.parse(m[2]!) as FollowedRollout, id: m[3] }));
      const rest = events.filter((e) => e.event === 'rollout');
      expect(rest.map((e) => [e.id, e.data.line.customId, e.data.trajectory?.rolloutId])).toEqual(streamed.slice(1).map((t) => [t.line.cursor, t.line.customId, t.line.rollout!.id]));
      expect(events.at(-1)!.event).toBe('end');
      expect((await api(cluster, token, 'GET', `/v1/batches/${batch.id}/events?trajectory=maybe`)).body.error.code).toBe('invalid_request');
      // The call in flight on gw-a when it died was taken over (re-issued by gw-b), not recorded twice.
      expect(calls.filter((c) => c.attempts.some((a) => a.outcome === 'owner_lost')).length, JSON.stringify(calls.map((c) => c.attempts))).toBeGreaterThanOrEqual(1);
    } finally {
      upstream.onRequest = undefined;
      upstream.delayMs = 0;
      await front.close();
      await streaming.catch(() => undefined);
    }
  }, 600_000);
});
