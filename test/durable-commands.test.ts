import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import type { Scope } from '../src/api/index.ts';
import { CommandLog, keys } from '../src/registry/index.ts';
import { RollboxClient, serverSentEvents } from '../src/client/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

const SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'admin'];
const NODE = 'node-durable';
let cluster: TestCluster;
let token: string;
let worker: ChildProcess;

// A restarted worker host must come back before the gateways declare its node lost.
beforeAll(async () => {
  cluster = await startTestCluster({ env: { ROLLBOX_NODE_LOST_AFTER_MS: '30000' } });
  token = await cluster.token('rl', SCOPES);
  worker = await startWorker();
});
afterAll(async () => cluster?.stop());

async function startWorker(env?: Record<string, string>): Promise<ChildProcess> {
  const child = await cluster.spawnWorker({ nodeId: NODE, ...(env ? { env } : {}) });
  const startedAfterMs = Date.now();
  await waitFor(
    `${NODE} ready`,
    async () => (await api(cluster, token, 'GET', '/v1/nodes')).body.nodes.some((n: { nodeId: string; ready?: boolean; atMs?: number }) => n.nodeId === NODE && n.ready !== false && (n.atMs ?? 0) >= startedAfterMs),
    60_000,
  );
  return child;
}

/** SIGKILLs the worker host process and starts a new one for the same node and data dir. */
async function restartWorker(env?: Record<string, string>): Promise<void> {
  const exited = new Promise((resolve) => worker.once('exit', resolve));
  worker.kill('SIGKILL');
  await exited;
  worker = await startWorker(env);
}

/** The real `rollbox` command as a child process, `input` on its stdin. */
function rollboxCli(args: string[], input = ''): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [path.resolve(import.meta.dirname, '../bin/rollbox.js'), ...args], { env: { ...process.env, ROLLBOX_URL: cluster.url, ROLLBOX_TOKEN: token }, stdio: ['pipe', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  child.stdin.end(input);
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, stdout, stderr }));
  });
}

const exec = (id: string, body: object) => api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, body);
const lines = async (id: string, file: string) => (await exec(id, { cmd: `cat ${file} 2>/dev/null | wc -l` })).body.stdout?.trim();

async function streamExec(sandboxId: string, body: object, onEvent: (e: { event: string; data: string }) => Promise<void>): Promise<{ event: string; data: string }[]> {
  const response = await fetch(`${cluster.url}/v1/sandboxes/${sandboxId}/exec`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', accept: 'text/event-stream' },
    body: JSON.stringify(body),
  });
  const events: { event: string; data: string }[] = [];
  for await (const event of serverSentEvents(response.body!)) {
    events.push(event);
    await onEvent(event);
  }
  return events;
}

describe('commands outlive their worker host', () => {
  it('a waiting caller, a re-sent commandId and a streaming exec get the real result after the worker is SIGKILLed and restarted; nothing runs twice', async () => {
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    expect(sandbox.node).toBe(NODE);
    const gate = 'while [ ! -e /tmp/go ]; do sleep 0.05; done';
    const turn = { cmd: `echo ran >> /root/runs; echo before; ${gate}; echo after; echo to-stderr >&2; exit 7`, commandId: 'turn-1', timeoutMs: 60_000 };
    const pending = exec(sandbox.id, turn);
    // A streaming one too: part of its output is streamed by the first worker, the rest by the next.
    let streamedBefore = false;
    const streamed = streamExec(sandbox.id, { cmd: `echo ran >> /root/streams; for i in 1 2 3; do echo s$i; done; ${gate}; for i in 4 5 6; do echo s$i; done`, commandId: 'stream-1' }, async (e) => {
      if (e.event === 'stdout' && e.data.includes('s1')) streamedBefore = true;
    });
    await waitFor('both commands to run', async () => streamedBefore && (await lines(sandbox.id, '/root/runs')) === '1');

    await restartWorker();
    expect((await exec(sandbox.id, { cmd: 'touch /tmp/go' })).body.exitCode).toBe(0);

    const answer = await pending;
    expect(answer.status, JSON.stringify(answer.body)).toBe(200);
    expect(answer.body).toMatchObject({ commandId: 'turn-1', exitCode: 7, stdout: 'before\nafter\n', stderr: 'to-stderr\n', replayed: false });
    const resent = await exec(sandbox.id, turn);
    expect(resent.body).toMatchObject({ commandId: 'turn-1', exitCode: 7, stdout: 'before\nafter\n', replayed: true });

    const events = await streamed;
    expect(events.filter((e) => e.event === 'stdout').map((e) => e.data).join('')).toBe('s1\ns2\ns3\ns4\ns5\ns6\n');
    expect(JSON.parse(events.at(-1)!.data)).toMatchObject({ exitCode: 0 });

    // Each ran once.
    expect(await lines(sandbox.id, '/root/runs')).toBe('1');
    expect(await lines(sandbox.id, '/root/streams')).toBe('1');
    const log = await api(cluster, token, 'GET', `/v1/sandboxes/${sandbox.id}/commands`);
    expect(log.body.commands.find((c: { commandId: string }) => c.commandId === 'turn-1')).toMatchObject({ state: 'done', result: { exitCode: 7 } });
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandbox.id}`);
  });

  it('a command the dying worker recorded as running but never handed to the init runs once, after the restart', async () => {
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    const exited = new Promise((resolve) => worker.once('exit', resolve));
    worker.kill('SIGKILL');
    await exited;
    // Sent while no worker runs: it waits in the node's inbox. Then made to look as a worker
    // that died right after recording its start would leave it: running, its message taken.
    const pending = exec(sandbox.id, { cmd: 'echo ran >> /root/late; echo late-result', commandId: 'late-1' });
    const redis = new Redis(cluster.redisUrl);
    try {
      const inbox = keys.inbox(NODE, 'ops');
      const raw = await waitFor('the exec in the inbox', async () => (await redis.lrange(inbox, 0, -1)).find((m) => m.includes('"late-1"')));
      await redis.multi().lrem(inbox, 1, raw).lpush(`${inbox}:taken`, raw).exec();
      await new CommandLog(redis).start(sandbox.id, 'late-1', JSON.parse(raw).requestId);
    } finally {
      redis.disconnect();
    }
    worker = await startWorker();
    const answer = await pending;
    expect(answer.body).toMatchObject({ commandId: 'late-1', exitCode: 0, stdout: 'late-result\n' });
    expect(await lines(sandbox.id, '/root/late')).toBe('1');
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandbox.id}`);
  });

  it('rollouts x turns, several at once, with the worker host SIGKILLed mid-load: no result_unknown, no turn run twice', async () => {
    const ROLLOUTS = 16;
    const TURNS = 10;
    const AT_ONCE = 8;
    const sandboxes: string[] = [];
    for (let i = 0; i < ROLLOUTS; i++) sandboxes.push((await api(cluster, token, 'POST', '/v1/sandboxes', {})).body.id);
    const outcomes: string[] = [];
    let turnsDone = 0;
    const rollout = async (r: number): Promise<void> => {
      for (let t = 0; t < TURNS; t++) {
        const answer = await exec(sandboxes[r]!, { cmd: `echo t${t} >> /root/turns; sleep 0.3; wc -l < /root/turns`, commandId: `r${r}-t${t}`, timeoutMs: 60_000 });
        outcomes.push(answer.status === 200 ? (answer.body.exitCode === 0 ? 'ok' : `exit ${answer.body.exitCode}`) : answer.body.error?.code);
        turnsDone++;
      }
    };
    const queue = [...sandboxes.keys()];
    const lanes = Array.from({ length: AT_ONCE }, async () => {
      for (let r = queue.shift(); r !== undefined; r = queue.shift()) await rollout(r);
    });
    await waitFor('a third of the turns', async () => turnsDone >= (ROLLOUTS * TURNS) / 3, 120_000);
    await restartWorker();
    await Promise.all(lanes);
    expect(outcomes.filter((o) => o !== 'ok')).toEqual([]);
    expect(outcomes).toHaveLength(ROLLOUTS * TURNS);
    for (const id of sandboxes) expect(await lines(id, '/root/turns')).toBe(String(TURNS));
    await Promise.all(sandboxes.map((id) => api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)));
  });
});

describe('past the grace', () => {
  it('a command taking stdin still takes it after its worker is SIGKILLed and restarted; one that does not, still refuses it', async () => {
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    expect((await exec(sandbox.id, { argv: ['cat'], background: true, stdinOpen: true, commandId: 'cat-restart' })).status).toBe(202);
    expect((await exec(sandbox.id, { cmd: 'sleep 60', background: true, commandId: 'sleep-restart' })).status).toBe(202);
    const command = (id: string) => api(cluster, token, 'GET', `/v1/sandboxes/${sandbox.id}/commands/${id}`);
    const stdin = (id: string, body: object) => api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/commands/${id}/stdin`, body);
    await waitFor('both running', async () => (await command('cat-restart')).body.state === 'running' && (await command('sleep-restart')).body.state === 'running');
    expect((await stdin('cat-restart', { data: 'before\n' })).status).toBe(200);
    await restartWorker();
    // Taken over by the new worker once it has attached to it again.
    await waitFor('stdin taken after the restart', async () => (await stdin('cat-restart', { data: 'after\n', eof: true })).status === 200, 30_000);
    const done = await waitFor('cat done', async () => ((await command('cat-restart')).body.state === 'done' ? (await command('cat-restart')).body : undefined), 30_000);
    expect(done).toMatchObject({ stdout: 'before\nafter\n', result: { exitCode: 0 } });
    expect((await stdin('sleep-restart', { data: 'x' })).body.error.code).toBe('invalid_state');
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandbox.id}`);
  });

  it('a command whose worker stayed away longer than its grace was killed by the init and answers result_unknown', async () => {
    const shortGrace = { ROLLBOX_COMMAND_GRACE_MS: '300' };
    await restartWorker(shortGrace);
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    const pending = exec(sandbox.id, { cmd: 'echo ran >> /root/short; sleep 30', commandId: 'short-1', timeoutMs: 60_000 });
    await waitFor('short-1 running', async () => (await lines(sandbox.id, '/root/short')) === '1');
    await restartWorker(shortGrace);
    const answer = await pending;
    expect(answer.body.error?.code, JSON.stringify(answer.body)).toBe('result_unknown');
    expect((await exec(sandbox.id, { cmd: 'ps -o args | grep -c "^sleep 30" || true' })).body.stdout.trim()).toBe('0');
    expect((await exec(sandbox.id, { cmd: 'echo ran >> /root/short; sleep 30', commandId: 'short-1' })).body.error.code).toBe('result_unknown');
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandbox.id}`);
    await restartWorker();
  });
});

describe('signal and stdin by command id', () => {
  it('feeds a background command stdin in pieces, closes it, and signals another', async () => {
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    const cat = await exec(sandbox.id, { argv: ['cat'], background: true, stdinOpen: true, commandId: 'cat-1' });
    expect(cat.status).toBe(202);
    // Sent at once: stdin that arrives while the init is still taking the command waits for it.
    const stdin = (body: object) => api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/commands/cat-1/stdin`, body);
    const first = await stdin({ data: 'hello ' });
    expect(first.status, JSON.stringify(first.body)).toBe(200);
    expect((await stdin({ data: 'world\n', eof: true })).body).toMatchObject({ commandId: 'cat-1', state: 'running' });
    const done = await waitFor('cat done', async () => {
      const s = await api(cluster, token, 'GET', `/v1/sandboxes/${sandbox.id}/commands/cat-1`);
      return s.body.state === 'done' ? s.body : undefined;
    });
    expect(done).toMatchObject({ stdout: 'hello world\n', result: { exitCode: 0 } });
    // Finished: nothing to write to any more.
    expect((await stdin({ data: 'late' })).body.error.code).toBe('invalid_state');
    // Not started with stdinOpen: refused, not silently dropped.
    await exec(sandbox.id, { cmd: 'sleep 30', background: true, commandId: 'closed-stdin' });
    await waitFor('closed-stdin running', async () => (await api(cluster, token, 'GET', `/v1/sandboxes/${sandbox.id}/commands/closed-stdin`)).body.state === 'running');
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/commands/closed-stdin/stdin`, { data: 'x' })).body.error.code).toBe('invalid_state');

    await exec(sandbox.id, { cmd: "trap 'echo got-term; exit 3' TERM; echo waiting; while true; do sleep 0.05; done", background: true, commandId: 'trap-1' });
    await waitFor('trap-1 waiting', async () => (await api(cluster, token, 'GET', `/v1/sandboxes/${sandbox.id}/commands/trap-1`)).body.stdout === 'waiting\n');
    const signal = (cid: string, body: object) => api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/commands/${cid}/signal`, body);
    expect((await signal('trap-1', { signal: 'TERM' })).status).toBe(200);
    const trapped = await waitFor('trap-1 done', async () => {
      const s = await api(cluster, token, 'GET', `/v1/sandboxes/${sandbox.id}/commands/trap-1`);
      return s.body.state === 'done' ? s.body : undefined;
    });
    expect(trapped).toMatchObject({ stdout: 'waiting\ngot-term\n', result: { exitCode: 3 } });

    await exec(sandbox.id, { cmd: 'sleep 600', background: true, commandId: 'sleep-1' });
    await waitFor('sleep-1 running', async () => (await api(cluster, token, 'GET', `/v1/sandboxes/${sandbox.id}/commands/sleep-1`)).body.state === 'running');
    expect((await signal('sleep-1', { signal: 'KILL' })).status).toBe(200);
    const killed = await waitFor('sleep-1 done', async () => {
      const s = await api(cluster, token, 'GET', `/v1/sandboxes/${sandbox.id}/commands/sleep-1`);
      return s.body.state === 'done' ? s.body : undefined;
    });
    expect(killed.result.exitCode).toBe(137);

    // The same through the TypeScript client.
    const client = new RollboxClient({ baseUrl: cluster.url, token });
    await client.execBackground(sandbox.id, { argv: ['sh', '-c', 'read a; read b; echo "$b $a"'], stdinOpen: true, commandId: 'ts-1' });
    await waitFor('ts-1 running', async () => (await client.commandStatus(sandbox.id, 'ts-1')).state === 'running');
    await client.writeStdin(sandbox.id, 'ts-1', 'first\n');
    await client.writeStdin(sandbox.id, 'ts-1', 'second\n', { eof: true });
    expect((await waitFor('ts-1 done', async () => { const st = await client.commandStatus(sandbox.id, 'ts-1'); return st.state === 'done' ? st : undefined; })).stdout).toBe('second first\n');
    await client.execBackground(sandbox.id, { cmd: 'sleep 600', commandId: 'ts-2' });
    await waitFor('ts-2 running', async () => (await client.commandStatus(sandbox.id, 'ts-2')).state === 'running');
    expect(await client.signalCommand(sandbox.id, 'ts-2', 'INT')).toEqual({ commandId: 'ts-2', state: 'running' });
    expect((await waitFor('ts-2 done', async () => { const st = await client.commandStatus(sandbox.id, 'ts-2'); return st.state === 'done' ? st : undefined; })).result?.exitCode).toBe(130);

    // And through the CLI: stdin piped in, then a signal.
    await client.execBackground(sandbox.id, { argv: ['cat'], stdinOpen: true, commandId: 'cli-1' });
    await waitFor('cli-1 running', async () => (await client.commandStatus(sandbox.id, 'cli-1')).state === 'running');
    expect(await rollboxCli(['command', 'stdin', sandbox.id, 'cli-1'], 'piped\nlines\n')).toMatchObject({ code: 0 });
    expect((await waitFor('cli-1 done', async () => { const st = await client.commandStatus(sandbox.id, 'cli-1'); return st.state === 'done' ? st : undefined; })).stdout).toBe('piped\nlines\n');
    await client.execBackground(sandbox.id, { cmd: 'sleep 600', commandId: 'cli-2' });
    await waitFor('cli-2 running', async () => (await client.commandStatus(sandbox.id, 'cli-2')).state === 'running');
    expect(await rollboxCli(['command', 'signal', sandbox.id, 'cli-2', 'SIGTERM'])).toMatchObject({ code: 0, stdout: 'sent TERM to cli-2\n' });
    expect((await waitFor('cli-2 done', async () => { const st = await client.commandStatus(sandbox.id, 'cli-2'); return st.state === 'done' ? st : undefined; })).result?.exitCode).toBe(143);
    expect(await rollboxCli(['command', 'signal', sandbox.id, 'cli-2', 'BOGUS'])).toMatchObject({ code: 1, stderr: expect.stringContaining('invalid_request') });

    // Bad input: coded errors.
    expect((await signal('sleep-1', { signal: 'NOPE' })).body.error.code).toBe('invalid_request');
    expect((await signal('no-such', { signal: 'TERM' })).body.error.code).toBe('not_found');
    expect((await signal('sleep-1', { signal: 'TERM' })).body.error.code).toBe('invalid_state');
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/commands/cat-1/stdin`, { data: 'x'.repeat(1024 * 1024 + 1) })).body.error.code).toMatch(/invalid_request|payload_too_large/);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandbox.id}`);
  });
});
