import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Scope } from '../src/api/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

const SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'admin'];
let cluster: TestCluster;
let token: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-c' }] });
  token = await cluster.token('rl', SCOPES);
});
afterAll(async () => cluster?.stop());

const exec = (id: string, body: object) => api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, body);

describe('command log', () => {
  it('replays a re-sent command instead of running it again, also after the sandbox is gone', async () => {
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    const append = { cmd: 'echo step >> /root/trajectory; wc -l < /root/trajectory', commandId: 'turn-1' };
    const first = await exec(sandbox.id, append);
    expect(first.body).toMatchObject({ commandId: 'turn-1', exitCode: 0, stdout: '1\n', replayed: false });
    const again = await exec(sandbox.id, append);
    expect(again.body).toMatchObject({ commandId: 'turn-1', stdout: '1\n', replayed: true });
    expect((await exec(sandbox.id, { argv: ['cat', '/root/trajectory'] })).body.stdout).toBe('step\n');

    const log = await api(cluster, token, 'GET', `/v1/sandboxes/${sandbox.id}/commands`);
    expect(log.body.commands.map((c: { commandId: string }) => c.commandId)[0]).toBe('turn-1');
    expect(log.body.commands[0]).toMatchObject({ state: 'done', argv: ['/bin/sh', '-c', append.cmd], result: { exitCode: 0, stdout: '1\n' } });
    expect(log.body.commands).toHaveLength(2);

    await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandbox.id}`);
    expect((await exec(sandbox.id, append)).body).toMatchObject({ stdout: '1\n', replayed: true });
  });

  it('runs concurrent requests with one commandId once; the second waits for the first', async () => {
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    const slow = { cmd: 'sleep 1; echo once >> /root/once; cat /root/once', commandId: 'slow-1' };
    const [a, b] = await Promise.all([exec(sandbox.id, slow), exec(sandbox.id, slow)]);
    expect([a.body.stdout, b.body.stdout]).toEqual(['once\n', 'once\n']);
    expect([a.body.replayed, b.body.replayed].sort()).toEqual([false, true]);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandbox.id}`);
  });

  it('answers result_unknown, never a silent re-run, when the worker host dies mid-command and does not come back', async () => {
    const child = await cluster.spawnWorker({ nodeId: 'node-dies' });
    await waitFor('node-dies heartbeat', async () => (await api(cluster, token, 'GET', '/v1/nodes')).body.nodes.some((n: { nodeId: string }) => n.nodeId === 'node-dies'));
    // Place on the doomed node: keep creating until one lands there.
    let sandbox: { id: string; node: string } | undefined;
    const others: string[] = [];
    for (let i = 0; i < 20 && !sandbox; i++) {
      const { body } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
      if (body.node === 'node-dies') sandbox = body;
      else others.push(body.id);
    }
    expect(sandbox).toBeDefined();
    const long = { cmd: 'echo started >> /root/side-effect; sleep 30', commandId: 'long-1', timeoutMs: 60_000 };
    const pending = exec(sandbox!.id, long);
    // Kill the worker once the command is running in the sandbox (its side effect is there).
    await waitFor('the long command to start', async () => (await exec(sandbox!.id, { argv: ['cat', '/root/side-effect'] })).body.stdout === 'started\n');
    child.kill('SIGKILL');
    const answer = await pending;
    expect(answer.status).toBe(409);
    expect(answer.body.error.code).toBe('result_unknown');
    const resent = await exec(sandbox!.id, long);
    expect(resent.body.error.code).toBe('result_unknown');
    const log = await api(cluster, token, 'GET', `/v1/sandboxes/${sandbox!.id}/commands`);
    // (The probes above may be logged before it: they raced it to the sandbox.)
    expect(log.body.commands.find((c: { commandId: string }) => c.commandId === 'long-1')).toMatchObject({ commandId: 'long-1', state: 'unknown' });
    await Promise.all(others.map((id) => api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)));
  });
});

describe('background commands', () => {
  it('return at once with a handle, keep running across turns, and report status and output', async () => {
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    const started = await exec(sandbox.id, { cmd: 'i=0; while [ $i -lt 3 ]; do echo tick$i; i=$((i+1)); sleep 0.4; done', background: true, commandId: 'bg-1' });
    expect(started.status).toBe(202);
    expect(started.body).toMatchObject({ commandId: 'bg-1', state: expect.stringMatching(/queued|running/) });
    const server = await exec(sandbox.id, { cmd: 'echo listening; sleep 30', background: true, commandId: 'server' });
    expect(server.status).toBe(202);

    // Other turns run meanwhile.
    expect((await exec(sandbox.id, { argv: ['echo', 'turn'] })).body.stdout).toBe('turn\n');
    const done = await waitFor('bg-1 done', async () => {
      const status = await api(cluster, token, 'GET', `/v1/sandboxes/${sandbox.id}/commands/bg-1`);
      return status.body.state === 'done' ? status.body : undefined;
    });
    expect(done).toMatchObject({ stdout: 'tick0\ntick1\ntick2\n', result: { exitCode: 0 } });
    const serving = await waitFor('server output', async () => {
      const status = await api(cluster, token, 'GET', `/v1/sandboxes/${sandbox.id}/commands/server`);
      return status.body.stdout === 'listening\n' ? status.body : undefined;
    });
    expect(serving.state).toBe('running');
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${sandbox.id}/commands/nope`)).status).toBe(404);
    // Starting needs sandbox:exec only: the answer must not be a 403 for a command that runs.
    const execOnly = await cluster.token('rl', ['sandbox:exec']);
    const quiet = await api(cluster, execOnly, 'POST', `/v1/sandboxes/${sandbox.id}/exec`, { cmd: 'true', background: true, commandId: 'exec-only' });
    expect(quiet.status, JSON.stringify(quiet.body)).toBe(202);
    expect(quiet.body.commandId).toBe('exec-only');
    expect((await api(cluster, execOnly, 'GET', `/v1/sandboxes/${sandbox.id}/commands/exec-only`)).status).toBe(403);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandbox.id}`);
  });
});
