/**
 * An idle host does no per-sandbox polling (issue 27): with the audit (the only sweep
 * left) pushed out to ten minutes, a few hundred idle sandboxes still have an init killed
 * from the host end `failed(init_lost)` at once, a TTL expire on time, and a sandbox
 * adopted by a restarted worker report its init's death the same way.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WorkerHandle } from '../src/roles/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

const NODE = 'idle-node';
const IDLE = 200;
/** Far past the test's length: whatever happens below, the audit did not find it. */
const AUDIT_MS = '600000';

let cluster: TestCluster;
let worker: WorkerHandle;
let token: string;
const ids: string[] = [];

const initPidOf = (id: string) => JSON.parse(fs.readFileSync(path.join(cluster.rootDir, NODE, 'worker', 'runc', `rb-${id}`, 'state.json'), 'utf8')).init_process_pid as number;

async function create(body: object = {}): Promise<string> {
  const r = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64, cpuMillis: 10, diskMiB: 16, requests: { memoryMiB: 4, cpuMillis: 2 } }, ...body });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body.id as string;
}

async function failedWith(id: string, what: string, timeoutMs = 10_000) {
  return waitFor(what, async () => {
    const s = await api(cluster, token, 'GET', `/v1/sandboxes/${id}`);
    return s.body.state === 'failed' && s.body;
  }, timeoutMs);
}

beforeAll(async () => {
  // Node loss is not what this tests: a loaded machine's slow heartbeat must not look like one.
  const env = { ROLLBOX_NODE_LOST_AFTER_MS: '10000', ROLLBOX_NODE_AUDIT_MS: AUDIT_MS, ROLLBOX_NODE_MAX_SANDBOXES: String(IDLE + 20), ROLLBOX_TENANT_MAX_SANDBOXES: String(IDLE + 20) };
  cluster = await startTestCluster({ env });
  worker = await cluster.addWorker({ nodeId: NODE, env });
  token = await cluster.token('idle', ['sandbox:create', 'sandbox:read', 'sandbox:exec', 'sandbox:delete']);
  let next = 0;
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      while (next++ < IDLE) ids.push(await create());
    }),
  );
}, 300_000);

afterAll(async () => {
  for (let i = 0; i < ids.length; i += 16) await Promise.all(ids.slice(i, i + 16).map((id) => api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)));
  await cluster?.stop();
}, 300_000);

describe(`${IDLE} idle sandboxes, no polling`, () => {
  it('ends a sandbox whose init is killed from the host failed(init_lost), by the event alone', async () => {
    const victim = ids.splice(Math.floor(ids.length / 2), 1)[0]!;
    process.kill(initPidOf(victim), 'SIGKILL');
    const failed = await failedWith(victim, 'the killed sandbox to fail');
    expect(failed.failureReason).toBe('init_lost');
    // Its neighbours are untouched.
    const neighbour = await api(cluster, token, 'POST', `/v1/sandboxes/${ids[0]}/exec`, { cmd: 'echo alive' });
    expect(neighbour.body.stdout).toBe('alive\n');
  });

  it('expires a TTL on time among them', async () => {
    const startedAtMs = Date.now();
    const short = await create({ ttlSeconds: 2 });
    const failed = await failedWith(short, 'the TTL to expire');
    expect(failed.failureReason).toBe('timeout');
    expect(Date.now() - startedAtMs).toBeGreaterThanOrEqual(2000);
    expect(Date.parse(failed.endedAt) - Date.parse(failed.expiresAt)).toBeLessThan(3000);
  });

  it('watches adopted sandboxes after a worker restart: a killed init still ends its sandbox at once', async () => {
    await worker.stop({ destroySandboxes: false });
    worker = await cluster.addWorker({ nodeId: NODE, env: { ROLLBOX_NODE_AUDIT_MS: AUDIT_MS, ROLLBOX_NODE_MAX_SANDBOXES: String(IDLE + 20) } });
    const victim = ids.splice(0, 1)[0]!;
    process.kill(initPidOf(victim), 'SIGKILL');
    expect((await failedWith(victim, 'the adopted sandbox to fail')).failureReason).toBe('init_lost');
    const other = await api(cluster, token, 'POST', `/v1/sandboxes/${ids[1]}/exec`, { cmd: 'echo adopted' });
    expect(other.body.stdout).toBe('adopted\n');
  });
});
