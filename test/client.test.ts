import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RollboxApiError, RollboxClient, type ExecStreamEvent } from '../src/client/index.ts';
import { startTestCluster, type TestCluster } from './support/cluster.ts';

let cluster: TestCluster;
let token: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-k' }] });
  token = await cluster.token('trainer', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
});
afterAll(async () => cluster?.stop());

describe('TypeScript client', () => {
  it('lets a new trainer process continue a rollout: re-sent commands replay, they do not re-run', async () => {
    const rollout = { idempotencyKey: 'rollout-7', turns: ['echo a >> /root/t', 'echo b >> /root/t', 'cat /root/t'] };
    const first = new RollboxClient({ baseUrl: cluster.url, token });
    const sandbox = await first.createSandbox({ labels: { rollout: '7' } }, { idempotencyKey: rollout.idempotencyKey });
    await first.exec(sandbox.id, { cmd: rollout.turns[0]!, commandId: 'r7-0' });
    await first.exec(sandbox.id, { cmd: rollout.turns[1]!, commandId: 'r7-1' });
    // The trainer is preempted here; a new process replays the rollout from its own log.

    const second = new RollboxClient({ baseUrl: cluster.url, token });
    const again = await second.createSandbox({ labels: { rollout: '7' } }, { idempotencyKey: rollout.idempotencyKey });
    expect(again.id).toBe(sandbox.id);
    const replies = [];
    for (const [i, cmd] of rollout.turns.entries()) replies.push(await second.exec(sandbox.id, { cmd, commandId: `r7-${i}` }));
    expect(replies.map((r) => r.replayed)).toEqual([true, true, false]);
    expect(replies[2]!.stdout).toBe('a\nb\n');
    expect((await second.commands(sandbox.id)).map((c) => c.commandId)).toEqual(['r7-0', 'r7-1', 'r7-2']);
    await second.deleteSandbox(sandbox.id);
  });

  it('retries through a gateway restart with the same commandId, running the command once', async () => {
    let failedOnce: () => void = () => {};
    const failed = new Promise<void>((resolve) => (failedOnce = resolve));
    const client = new RollboxClient({ baseUrl: cluster.url, token, retry: { attempts: 20, baseDelayMs: 100, maxDelayMs: 500 }, onRetry: ({ error }) => error.code === 'network' && failedOnce() });
    const sandbox = await client.createSandbox();
    await cluster.stopGateway();
    const pending = client.exec(sandbox.id, { cmd: 'echo once >> /root/o; cat /root/o', commandId: 'during-restart' });
    await failed; // the client found the gateway down and is retrying
    await cluster.startGateway();
    expect((await pending).stdout).toBe('once\n');
    expect(await client.exec(sandbox.id, { cmd: 'echo once >> /root/o; cat /root/o', commandId: 'during-restart' })).toMatchObject({ stdout: 'once\n', replayed: true });
    await client.deleteSandbox(sandbox.id);
  });

  it('streams output chunks, then the exit; pauses, resumes and snapshots', async () => {
    const builder = await cluster.token('trainer', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:snapshot']);
    const client = new RollboxClient({ baseUrl: cluster.url, token: builder });
    const sandbox = await client.createSandbox({ job: 'job-c' });
    const events: ExecStreamEvent[] = [];
    for await (const e of client.streamExec(sandbox.id, { cmd: 'echo one; sleep 0.3; echo two >&2; echo three', commandId: 'stream-1' })) events.push(e);
    const text = (stream: string) => events.flatMap((e) => (e.type === stream && 'data' in e ? [e.data] : [])).join('');
    expect([text('stdout'), text('stderr')]).toEqual(['one\nthree\n', 'two\n']);
    expect(events.at(-1)).toMatchObject({ type: 'exit', result: { exitCode: 0 } });

    await client.exec(sandbox.id, { cmd: 'head -c 8000000 /dev/urandom > /root/noise' });
    const sample = await client.metrics(sandbox.id);
    expect(sample.memUsed).toBeGreaterThan(0);
    expect(sample.diskUsed).toBeGreaterThanOrEqual(8_000_000);
    expect((await client.pause(sandbox.id)).state).toBe('paused');
    expect((await client.resume(sandbox.id)).state).toBe('running');
    const job = await client.pauseJob('job-c');
    expect(job.results.map((r) => r.id)).toEqual([sandbox.id]);
    await client.resumeJob('job-c');
    await client.exec(sandbox.id, { cmd: 'echo kept > /root/k' });
    const layer = await client.snapshot(sandbox.id, { exclude: ['/tmp'] });
    expect(layer.parents.length).toBeGreaterThan(0);
    const restored = await client.createSandbox({ image: { base: 'busybox', layers: [layer.digest] } });
    expect((await client.exec(restored.id, { cmd: 'cat /root/k' })).stdout).toBe('kept\n');
    await Promise.all([client.deleteSandbox(sandbox.id), client.deleteSandbox(restored.id)]);
  });

  it('surfaces API errors with their code and does not retry them', async () => {
    const client = new RollboxClient({ baseUrl: cluster.url, token });
    const error = await client.getSandbox('sbx_missing').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RollboxApiError);
    expect(error).toMatchObject({ status: 404, code: 'not_found' });
  });
});
