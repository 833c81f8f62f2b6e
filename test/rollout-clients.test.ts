import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Batch, Rollout, Trajectory } from '../src/api/index.ts';
import { BatchesClient, RollboxClient, RolloutsClient, type FollowedRollout } from '../src/client/index.ts';
import { api, startTestCluster, type TestCluster } from './support/cluster.ts';
import { BUSYBOX_AGENT_CMD } from './support/busybox-agent.ts';
import { ScriptedUpstream } from './support/model-upstream.ts';
import { runRollbox } from './support/cli.ts';

// Issue 39 point 6, the trainer's side: the TS client and the CLI submit hosted rollouts,
// follow a batch's finished rollouts with their trajectories (each once across a restart of
// the follower, from its cursor) and show one. The agent is busybox: one model call through
// the gateway, then one command in its task sandbox through the rollbox API.
const JOB = 'job-rc';

let cluster: TestCluster;
let upstream: ScriptedUpstream;
let token: string;
let rollouts: RolloutsClient;
let dir: string;

const rolloutTask = (customId: string) => ({ customId, resources: { memoryMiB: 32, cpuMillis: 200 }, agent: { cmd: BUSYBOX_AGENT_CMD, env: { AGENT_N: customId }, timeoutMs: 180_000 }, model: { job: JOB } });

/** The real `rollbox` command as a child process. */
const rollbox = (args: string[]) => runRollbox(args, { url: cluster.url, token, cwd: dir });

/** The trajectory of one busybox agent run: its model call, then its command in the task sandbox. */
function expectAgentTrajectory(trajectory: Trajectory | undefined, rolloutId: string, customId: string): void {
  expect(trajectory?.rolloutId).toBe(rolloutId);
  const kinds = trajectory!.entries.map((e) => (e.kind === 'model_call' ? 'model' : `command ${e.command.argv.at(-1)}`));
  expect(kinds).toEqual(['model', `command echo tool-${customId}`]);
}

beforeAll(async () => {
  [cluster, upstream] = await Promise.all([startTestCluster({ workers: [{ nodeId: 'node-rc' }] }), ScriptedUpstream.start({ script: [{ text: 'run the tool' }] })]);
  token = await cluster.token('team-rc', ['rollout:submit', 'batch:submit']);
  const put = await api(cluster, token, 'PUT', `/v1/jobs/${JOB}/model`, { upstreams: [{ baseUrl: upstream.url }] });
  expect(put.status, JSON.stringify(put.body)).toBe(200);
  rollouts = new RolloutsClient(new RollboxClient({ baseUrl: cluster.url, token }));
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rollbox-rollout-cli-'));
}, 120_000);
afterAll(async () => {
  await upstream?.stop();
  await cluster?.stop();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
}, 60_000);

describe('rollout clients', () => {
  it('follows a batch of rollouts with their trajectories; a follower stopped and resumed from its cursor gets each rollout once', async () => {
    const batch = await new BatchesClient(new RollboxClient({ baseUrl: cluster.url, token })).submitBatch({ tasks: ['a', 'b', 'c'].map(rolloutTask), maxConcurrency: 3 });

    // The trainer takes one rollout and dies (the generator is dropped mid-batch), keeping the cursor of what it took.
    const taken: FollowedRollout[] = [];
    for await (const followed of rollouts.followRollouts(batch.id)) {
      taken.push(followed);
      break;
    }
    expect((await rollouts.getRollout(taken[0]!.line.rollout!.id)).task.state).toBe('done');
    // Restarted from that cursor, it gets the rest, and stops once the batch has ended.
    for await (const followed of rollouts.followRollouts(batch.id, { after: taken[0]!.cursor })) taken.push(followed);

    expect(taken.map((t) => t.line.customId).sort()).toEqual(['a', 'b', 'c']);
    for (const { line, trajectory, cursor } of taken) {
      expect(line, JSON.stringify(line)).toMatchObject({ status: 'succeeded', agent: { exitCode: 0 }, rollout: { modelCalls: 1 } });
      expect(cursor).toBe(line.cursor);
      expectAgentTrajectory(trajectory, line.rollout!.id, line.customId);
    }
    const rollout: Rollout = await rollouts.getRollout(taken[2]!.line.rollout!.id);
    expect(rollout).toMatchObject({ batchId: batch.id, customId: taken[2]!.line.customId, job: JOB, task: { state: 'done', status: 'succeeded' }, usage: { modelCalls: 1 } });

    // The CLI follows from the same cursor: the same two rollouts, as NDJSON {line, trajectory}, progress on stderr.
    const follow = await rollbox(['rollout', 'follow', batch.id, '--after', taken[0]!.cursor]);
    expect(follow.code, follow.stderr).toBe(0);
    const lines = follow.stdout.trim().split('\n').map((l) => JSON.parse(l) as Omit<FollowedRollout, 'cursor'>);
    expect(lines.map((l) => l.line.customId)).toEqual(taken.slice(1).map((t) => t.line.customId));
    for (const { line, trajectory } of lines) expectAgentTrajectory(trajectory, line.rollout!.id, line.customId);
    expect(follow.stderr).toContain(`rollout ${taken[1]!.line.rollout!.id}: succeeded`);
    expect(follow.stderr).toContain('2 rollouts');
  }, 180_000);

  it('submits and shows a rollout and its trajectory with the CLI', async () => {
    const file = path.join(dir, 'rollout.json');
    fs.writeFileSync(file, JSON.stringify({ task: rolloutTask('cli'), metadata: { via: 'cli' } }));
    const submit = await rollbox(['rollout', 'submit', file]);
    expect(submit.code, submit.stderr).toBe(0);
    const batch = JSON.parse(submit.stdout) as Batch;
    expect(batch).toMatchObject({ state: 'in_progress', counts: { total: 1 }, options: { metadata: { via: 'cli' } } });

    // (The CLI's follow is the first test's.)
    const followed: FollowedRollout[] = [];
    for await (const f of rollouts.followRollouts(batch.id)) followed.push(f);
    expect(followed).toHaveLength(1);
    const id = followed[0]!.line.rollout!.id;
    expect(id).toBe(`${batch.id}.cli.1`);

    // Bad input too: a file that is not JSON, a rollout that does not exist (the API's code, exit 1).
    fs.writeFileSync(path.join(dir, 'bad.json'), '{"task":');
    const [show, shown, bad, missing] = await Promise.all([
      rollbox(['rollout', 'show', id]),
      rollbox(['rollout', 'show', id, '--trajectory']),
      rollbox(['rollout', 'submit', 'bad.json']),
      rollbox(['rollout', 'show', `${batch.id}.nope.1`]),
    ]);
    expect(show.code, show.stderr).toBe(0);
    expect(JSON.parse(show.stdout)).toMatchObject({ id, batchId: batch.id, task: { state: 'done', status: 'succeeded' }, usage: { modelCalls: 1 } });
    expect(shown.code, shown.stderr).toBe(0);
    expect(JSON.parse(shown.stdout)).toEqual(followed[0]!.trajectory);
    expectAgentTrajectory(await rollouts.rolloutTrajectory(id), id, 'cli');
    expect(bad.code).toBe(1);
    expect(bad.stderr).toContain('invalid_request');
    expect(missing.code).toBe(1);
    expect(missing.stderr).toContain('not_found');
  }, 120_000);
});
