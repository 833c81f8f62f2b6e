import type { ChildProcess } from 'node:child_process';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Scope } from '../src/api/index.ts';
import { keys } from '../src/registry/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

/**
 * A command whose inbox push was lost (its gateway died between recording it and pushing it,
 * or Redis failed over in between) is sent again by a re-send of its commandId: the record
 * keeps the op until the command starts. The worker host is stopped (SIGSTOP) while the test
 * plays the lost push, and its waiting take (a BLMOVE Redis would answer even while the
 * process is stopped) is cut, so nothing takes the op before it is gone.
 */
const SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'admin'];
const NODE = 'node-resend';
let cluster: TestCluster;
let token: string;
let worker: ChildProcess;
let redis: Redis;
let sandboxId: string;

beforeAll(async () => {
  cluster = await startTestCluster({ env: { ROLLBOX_NODE_LOST_AFTER_MS: '30000', ROLLBOX_NODE_STALE_AFTER_MS: '30000' } });
  token = await cluster.token('resend', SCOPES);
  worker = await cluster.spawnWorker({ nodeId: NODE });
  await waitFor(`${NODE} ready`, async () => (await api(cluster, token, 'GET', '/v1/nodes')).body.nodes.some((n: { nodeId: string; ready?: boolean }) => n.nodeId === NODE && n.ready !== false), 60_000);
  redis = new Redis(cluster.redisUrl);
  const created = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 }, ttlSeconds: 300 });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  sandboxId = created.body.id as string;
});

afterAll(async () => {
  worker?.kill('SIGCONT');
  if (sandboxId) await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandboxId}`).catch(() => undefined);
  redis?.disconnect();
  await cluster?.stop();
});

const exec = (body: object) => api(cluster, token, 'POST', `/v1/sandboxes/${sandboxId}/exec`, body);
const record = (commandId: string) => redis.hgetall(keys.command(sandboxId, commandId));

/** With the worker host stopped: the command is recorded and pushed, then what the test does with the inbox happens, then the host goes on. */
async function whileHostStopped(commandId: string, cmd: string, meanwhile: () => Promise<void>): Promise<void> {
  worker.kill('SIGSTOP');
  try {
    await new Promise((r) => setTimeout(r, 100));
    // Its take in progress ends (the host, going on, takes again on a new connection).
    const clients = String(await redis.call('CLIENT', 'LIST')).split('\n');
    for (const line of clients.filter((l) => / cmd=blmove /.test(l))) await redis.call('CLIENT', 'KILL', 'ID', /^id=(\d+)/.exec(line)![1]!);
    const sent = await exec({ cmd, commandId, background: true, env: { SECRET_FOR_THIS_COMMAND: 'only-for-its-start' } });
    expect(sent.status, JSON.stringify(sent.body)).toBe(202);
    expect(await record(commandId)).toMatchObject({ state: 'queued', op: expect.stringContaining('only-for-its-start') });
    await meanwhile();
  } finally {
    worker.kill('SIGCONT');
  }
}

const ended = (commandId: string) => waitFor(`${commandId} ended`, async () => ((await record(commandId)).state === 'done' ? record(commandId) : undefined), 30_000);

describe('a command re-sent under its commandId', () => {
  it('is pushed again from its record when its first push was lost, runs once, and its record then holds no op', async () => {
    await whileHostStopped('lost-push', 'echo ran >> /tmp/lost-push.log', async () => {
      // The push lost: the host's inbox emptied before the host took it.
      await redis.del(keys.inbox(NODE, 'ops'));
      // The client, having no answer, sends it again.
      const again = await exec({ cmd: 'echo ran >> /tmp/lost-push.log', commandId: 'lost-push', background: true });
      expect(again.status, JSON.stringify(again.body)).toBe(202);
    });
    const done = await ended('lost-push');
    expect(done.op).toBeUndefined();
    expect((await exec({ cmd: 'wc -l < /tmp/lost-push.log' })).body.stdout.trim()).toBe('1');
  }, 60_000);

  it('pushed twice while queued (its first push was not lost), still runs once', async () => {
    await whileHostStopped('twice', 'echo ran >> /tmp/twice.log', async () => {
      const again = await exec({ cmd: 'echo ran >> /tmp/twice.log', commandId: 'twice', background: true });
      expect(again.status, JSON.stringify(again.body)).toBe(202);
      expect(await redis.llen(keys.inbox(NODE, 'ops'))).toBe(2);
    });
    await ended('twice');
    // The second message is taken and dropped (the command is no longer queued).
    await waitFor('the inbox emptied', async () => (await redis.llen(keys.inbox(NODE, 'ops'))) === 0 && (await redis.llen(`${keys.inbox(NODE, 'ops')}:taken`)) === 0, 10_000);
    expect((await exec({ cmd: 'wc -l < /tmp/twice.log' })).body.stdout.trim()).toBe('1');
  }, 60_000);
});
