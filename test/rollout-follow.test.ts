import { spawn } from 'node:child_process';
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROLLOUT_TIME_PARTS, type Batch, type FollowedRollout, type Trajectory } from '../src/api/index.ts';
import { RollboxClient, RolloutsClient } from '../src/client/index.ts';
import { runRollbox } from './support/cli.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { BUSYBOX_AGENT_CMD } from './support/busybox-agent.ts';
import { ScriptedUpstream } from './support/model-upstream.ts';

// Issue 39's small open points: the CLI's and the Python client's follow read the batch's
// events stream (SSE), resumed from their last cursor when it is cut, within bounded tries,
// with coded errors; and a rollout its batch's cancel ended has its times, counted once. The
// agent is busybox: one model call through the gateway, then one command in its task sandbox
// (then, for the cancelled one, a sleep the cancel cuts short).
const REPO = path.resolve(import.meta.dirname, '..');
const JOB = 'job-rf';
const CANCEL_JOB = 'job-rf-cancel';
const TENANT = 'team-rf';

let cluster: TestCluster;
let upstream: ScriptedUpstream;
let token: string;
let followedBatch: Batch | undefined;

const rolloutTask = (customId: string, job = JOB, then = '') => ({
  customId,
  resources: { memoryMiB: 32, cpuMillis: 200 },
  agent: { cmd: BUSYBOX_AGENT_CMD + then, env: { AGENT_N: customId }, timeoutMs: 180_000 },
  model: { job },
});

/** How a follower's events streams are cut: after their first rollout event, before any event, or not. */
type Cut = 'after-first-rollout' | 'before-any-event' | 'none';

/**
 * An HTTP front of the gateway that cuts batch events streams as `cut(n)` says for the nth
 * (1-based), and records each one's Last-Event-ID: a proxy or a gateway dying under a follower.
 */
async function startCutter(cut: (n: number) => Cut): Promise<{ url: string; lastEventIds: (string | undefined)[]; close(): Promise<void> }> {
  const target = new URL(cluster.url);
  const lastEventIds: (string | undefined)[] = [];
  const sockets = new Set<Socket>();
  const server = http.createServer((req, res) => {
    const isEvents = req.url!.includes('/events');
    const mode: Cut = isEvents ? cut(lastEventIds.push(req.headers['last-event-id'] as string | undefined)) : 'none';
    const cutNow = (text: string) => res.write(text, () => res.socket?.destroy());
    const forward = http.request({ host: target.hostname, port: target.port, path: req.url, method: req.method, headers: req.headers }, (answer) => {
      res.writeHead(answer.statusCode!, answer.headers);
      if (mode === 'none' || answer.statusCode !== 200) return void answer.pipe(res);
      // A comment first, so the answer's head is out before the cut: the cut is of a stream, not of a request.
      if (mode === 'before-any-event') return void (cutNow(': cut\n\n'), answer.destroy());
      answer.setEncoding('utf8');
      let text = '';
      answer.on('data', (chunk: string) => {
        text += chunk;
        const end = text.indexOf('\n\n', text.indexOf('event: rollout'));
        if (!text.includes('event: rollout') || end < 0) return;
        cutNow(text.slice(0, end + 2));
        answer.destroy();
      });
      answer.on('end', () => res.end(text));
    });
    forward.on('error', () => res.destroy());
    req.pipe(forward);
  });
  server.on('connection', (socket) => {
    sockets.add(socket);
    socket.once('close', () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    lastEventIds,
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

interface PythonFollowed {
  customId?: string;
  cursor?: string;
  rolloutId?: string;
  trajectoryOf?: string;
  kinds?: string[];
  end?: boolean;
  error?: string;
  code?: string;
}

/** The Python client following a batch (test/support/python-rollout-follow.py): what it printed, a line each. */
async function pythonFollow(url: string, as: string, batchId: string, mode: 'sync' | 'async', attempts?: number): Promise<PythonFollowed[]> {
  const args = [path.join(REPO, 'test/support/python-rollout-follow.py'), url, as, batchId, mode, ...(attempts ? [String(attempts)] : [])];
  const child = spawn('/usr/bin/python3', args, { env: { ...process.env, PYTHONPATH: path.join(REPO, 'clients/python'), PYTHONDONTWRITEBYTECODE: '1' }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
  expect(code, stderr).toBe(0);
  return stdout.trim().split('\n').map((l) => JSON.parse(l) as PythonFollowed);
}

beforeAll(async () => {
  [cluster, upstream] = await Promise.all([startTestCluster({ workers: [{ nodeId: 'node-rf' }] }), ScriptedUpstream.start({ script: [{ text: 'run the tool' }] })]);
  token = await cluster.token(TENANT, ['rollout:submit', 'batch:submit']);
  for (const job of [JOB, CANCEL_JOB]) {
    const put = await api(cluster, token, 'PUT', `/v1/jobs/${job}/model`, { upstreams: [{ baseUrl: upstream.url }] });
    expect(put.status, JSON.stringify(put.body)).toBe(200);
  }
}, 120_000);
afterAll(async () => {
  await upstream?.stop();
  await cluster?.stop();
}, 60_000);

describe('following rollouts over server-sent events', () => {
  it('the CLI and the Python client (sync and asyncio), cut after their first rollout, resume from its cursor: each rollout once, with its trajectory', async () => {
    const batch = (await api<Batch>(cluster, token, 'POST', '/v1/batches', { tasks: ['a', 'b'].map((id) => rolloutTask(id)), maxConcurrency: 2 })).body;
    expect(batch.id, JSON.stringify(batch)).toBeTruthy();
    followedBatch = batch;
    const fronts = await Promise.all([1, 2, 3].map(() => startCutter((n) => (n === 1 ? 'after-first-rollout' : 'none'))));
    try {
      const [cli, sync, aio] = await Promise.all([
        runRollbox(['rollout', 'follow', batch.id], { url: fronts[0]!.url, token }),
        pythonFollow(fronts[1]!.url, token, batch.id, 'sync'),
        pythonFollow(fronts[2]!.url, token, batch.id, 'async'),
      ]);
      expect(cli.code, cli.stderr).toBe(0);
      const cliLines = cli.stdout.trim().split('\n').map((l) => JSON.parse(l) as FollowedRollout);
      // The same output shape as before: {line, trajectory} a line, progress on stderr.
      const taken = cliLines.map(({ line, trajectory }) => ({ customId: line.customId, cursor: line.cursor, rolloutId: line.rollout?.id, trajectoryOf: trajectory?.rolloutId, kinds: trajectory?.entries.map((e) => e.kind) }));
      expect(cli.stderr).toContain('2 rollouts');
      for (const [i, followed] of [taken, sync.slice(0, -1), aio.slice(0, -1)].entries()) {
        expect(followed.map((f) => f.customId).sort(), `follower ${i}`).toEqual(['a', 'b']);
        for (const f of followed) expect(f, `follower ${i}`).toMatchObject({ rolloutId: `${batch.id}.${f.customId}.1`, trajectoryOf: f.rolloutId, kinds: ['model_call', 'command'] });
        // Its stream was cut after the first rollout: it came back once, from that rollout's cursor.
        expect(fronts[i]!.lastEventIds, `follower ${i}`).toEqual([undefined, followed[0]!.cursor]);
      }
      expect([sync.at(-1), aio.at(-1)]).toEqual([{ end: true }, { end: true }]);
      expect(sync.slice(0, -1)).toEqual(taken);
    } finally {
      await Promise.all(fronts.map((f) => f.close()));
    }
  }, 180_000);

  it('an unknown batch is not_found, a token without the scope forbidden, and a stream cut again and again gives up after bounded tries', async () => {
    const batch = followedBatch ?? (await api<Batch>(cluster, token, 'POST', '/v1/batches', { tasks: [rolloutTask('c')] })).body;
    const noScope = await cluster.token(TENANT, ['sandbox:read']);
    const fronts = await Promise.all([1, 2].map(() => startCutter(() => 'before-any-event')));
    try {
      const [unknownCli, unknownPy, forbiddenPy, cutCli, cutPy] = await Promise.all([
        runRollbox(['rollout', 'follow', 'batch_nope'], { url: cluster.url, token }),
        pythonFollow(cluster.url, token, 'batch_nope', 'sync'),
        pythonFollow(cluster.url, noScope, batch.id, 'async'),
        runRollbox(['rollout', 'follow', batch.id], { url: fronts[0]!.url, token }),
        pythonFollow(fronts[1]!.url, token, batch.id, 'sync', 3),
      ]);
      expect(unknownCli.code).toBe(1);
      expect(unknownCli.stderr).toMatch(/not_found: .*batch_nope/);
      expect(unknownPy).toEqual([{ error: 'NotFound', code: 'not_found' }]);
      expect(forbiddenPy).toEqual([{ error: 'Forbidden', code: 'forbidden' }]);
      // Cut each time before a rollout: the CLI gives up after 6 connections, the Python client after its RetryPolicy's attempts.
      expect(cutCli.code).toBe(1);
      expect(cutCli.stderr).toMatch(/network: the events of batch .* were cut 6 times in a row/);
      expect(fronts[0]!.lastEventIds).toHaveLength(6);
      expect(cutPy).toEqual([{ error: 'ConnectionFailed', code: 'connection' }]);
      expect(fronts[1]!.lastEventIds).toHaveLength(3);
    } finally {
      await Promise.all(fronts.map((f) => f.close()));
    }
  }, 120_000);
});

describe('a cancelled rollout', () => {
  it('ends cancelled with its times up to the cancel, kept with its record and counted once for its job and in Prometheus', async () => {
    const submittedAtMs = Date.now();
    // After its model call and its tool, the agent sleeps: the batch's cancel ends it.
    const batch = (await api<Batch>(cluster, token, 'POST', '/v1/batches', { tasks: [rolloutTask('slow', CANCEL_JOB, ' && sleep 600')] })).body;
    const rollouts = new RolloutsClient(new RollboxClient({ baseUrl: cluster.url, token }));
    const rolloutId = `${batch.id}.slow.1`;
    // Until its tool command has ended (the rollout's record and trajectory are 404 before its agent starts).
    await waitFor('the agent\'s tool command', async () => {
      const entries = (await api<Trajectory>(cluster, token, 'GET', `/v1/rollouts/${rolloutId}/trajectory`)).body.entries ?? [];
      return entries.length === 2 && entries[1]!.kind === 'command' && entries[1]!.command.endedAt !== undefined;
    }, 120_000);
    const cancelRequestedAtMs = Date.now();
    expect((await api(cluster, token, 'POST', `/v1/batches/${batch.id}/cancel`)).status).toBe(200);
    const followed: FollowedRollout[] = [];
    for await (const f of rollouts.streamRollouts(batch.id)) followed.push(f);
    const endedAtMs = Date.now();

    expect(followed).toHaveLength(1);
    const { line, trajectory } = followed[0]!;
    expect(line, JSON.stringify(line)).toMatchObject({ status: 'cancelled', error: { code: 'cancelled' }, rollout: { id: rolloutId, modelCalls: 1 } });
    const times = line.rollout!.timesMs!;
    expect(times, JSON.stringify(line)).toBeDefined();
    // Its window: from its start (after the submit) to the cancel (after it was asked for), the parts summing to it.
    expect(times.total).toBe(ROLLOUT_TIME_PARTS.reduce((sum, part) => sum + times[part], 0));
    const [call, command] = trajectory!.entries;
    expect(times.total).toBeGreaterThanOrEqual(cancelRequestedAtMs - Date.parse(call!.at));
    expect(times.total).toBeLessThanOrEqual(endedAtMs - submittedAtMs);
    expect(times.modelUpstream).toBeGreaterThan(0);
    expect(times.tool).toBeGreaterThan(0);
    expect(command!.kind).toBe('command');
    // The sleep after the tool is the agent's own time, up to the cancel.
    expect(times.agent).toBeGreaterThanOrEqual(cancelRequestedAtMs - Date.parse(command!.kind === 'command' ? command!.command.endedAt! : ''));

    // Kept with its record, and counted once: one ended cancelled, one timed, its times the sums.
    expect((await rollouts.getRollout(rolloutId)).timesMs).toEqual(times);
    expect(await rollouts.jobRolloutTimes(CANCEL_JOB)).toMatchObject({ ended: { cancelled: 1, succeeded: 0 }, timed: 1, timesMs: times, completionRate: 0 });
    const metrics = await (await fetch(`${cluster.url}/metrics`)).text();
    const metric = (name: string, label: string) => Number(metrics.split('\n').find((l) => l.startsWith(`${name}{`) && l.includes(`tenant="${TENANT}",job="${CANCEL_JOB}"`) && l.includes(label))?.split(' ').at(-1));
    expect(metric('rollbox_rollouts_ended_total', 'outcome="cancelled"')).toBe(1);
    for (const part of ROLLOUT_TIME_PARTS) expect(metric('rollbox_rollout_seconds_total', `part="${part}"`), part).toBeCloseTo(times[part] / 1000, 3);
  }, 180_000);
});
