import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NodeHeartbeat, RunResult } from '../src/api/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

/** The function-call tier, POST /v1/run: one command in a fresh sandbox, its outcome in one of four classes. */
const NODE = 'node-run1';
let cluster: TestCluster;
let token: string;
let admin: string;

beforeAll(async () => {
  // Room for a few small sandboxes only: a larger one is a platform refusal (no capacity).
  cluster = await startTestCluster({ workers: [{ nodeId: NODE, env: { ROLLBOX_NODE_MEMORY_MIB: '1024' } }] });
  token = await cluster.token('fn', ['sandbox:run', 'sandbox:read']);
  admin = await cluster.token('ops', ['admin']);
}, 60_000);

afterAll(async () => {
  await cluster?.stop();
}, 60_000);

const run = (body: object, withToken = token) => api<RunResult>(cluster, withToken, 'POST', '/v1/run', { resources: { memoryMiB: 64, diskMiB: 64 }, ...body });
const b64 = (text: string) => Buffer.from(text).toString('base64');

describe('POST /v1/run', () => {
  it('needs sandbox:run and a valid body', async () => {
    expect((await run({ cmd: 'true' }, await cluster.token('fn', ['sandbox:create', 'sandbox:exec']))).status).toBe(403);
    expect((await run({})).status).toBe(400);
    expect((await run({ cmd: 'true', argv: ['true'] })).status).toBe(400);
    expect((await run({ cmd: 'true', files: { '../escape': b64('x') } })).status).toBe(400);
    expect((await run({ cmd: 'true', files: { a: 'not base64!' } })).status).toBe(400);
    const missing = await run({ cmd: 'true', image: { base: 'no-such-layer' } });
    expect(missing.status).toBe(404);
  });

  it('runs a command with its files, stdin and env, and says ok', async () => {
    const r = await run({ cmd: 'cat input.txt sub/more.txt; echo "$GREETING"; cat; pwd', files: { 'input.txt': b64('hello\n'), 'sub/more.txt': b64('more\n'), '/etc/abs.txt': b64('x') }, env: { GREETING: 'hi' }, stdin: 'from stdin\n' });
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ status: 'ok', exitCode: 0, stdout: 'hello\nmore\nhi\nfrom stdin\n/tmp\n', stderr: '', truncated: false, oomKilled: false });
    expect(r.body.totalMs).toBeGreaterThanOrEqual(r.body.durationMs);
    // Discarded afterwards.
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${r.body.sandboxId}`)).body.state).toBe('terminated');
    const argv = await run({ argv: ['cat', '/etc/abs.txt'], files: { '/etc/abs.txt': b64('absolute') } });
    expect(argv.body).toMatchObject({ status: 'ok', stdout: 'absolute' });
  });

  it('keeps failed, timeout and infra_error apart', async () => {
    const failed = await run({ cmd: 'echo oops >&2; exit 3' });
    expect(failed.body).toMatchObject({ status: 'failed', exitCode: 3, stderr: 'oops\n' });
    const timeout = await run({ cmd: 'echo started; sleep 30', timeoutMs: 300 });
    expect(timeout.body).toMatchObject({ status: 'timeout', exitCode: null, stdout: 'started\n' });
    // More memory than any host has room for: the platform cannot serve it now (safe to retry).
    const infra = await run({ cmd: 'true', resources: { memoryMiB: 4096, diskMiB: 64 } });
    expect(infra.status).toBe(200);
    expect(infra.body).toMatchObject({ status: 'infra_error', exitCode: null, error: { code: 'no_capacity' } });
  });

  it('shares nothing between calls, uses a matching warm pool, and leaves nothing behind', async () => {
    expect((await run({ cmd: 'echo secret > /tmp/left; sleep 1000 >/dev/null 2>&1 &' })).body.status).toBe('ok');
    expect((await run({ cmd: 'cat /tmp/left; ps -o comm | grep -c sleep' })).body).toMatchObject({ status: 'failed', stdout: '0\n' });

    expect((await api(cluster, admin, 'PUT', '/v1/pools/fn', { size: 2, diskMiB: 64, resources: { memoryMiB: 64 } })).status).toBe(200);
    await waitFor('the pool ready', async () => (await api<{ nodes: NodeHeartbeat[] }>(cluster, admin, 'GET', '/v1/nodes')).body.nodes.find((n) => n.nodeId === NODE && n.healthy)?.pools?.fn?.ready === 2, 30_000);
    const pooled = await run({ cmd: 'echo warm' });
    expect(pooled.body).toMatchObject({ status: 'ok', stdout: 'warm\n', pool: 'fn' });
    expect((await api(cluster, admin, 'DELETE', '/v1/pools/fn')).status).toBe(204);

    await waitFor('no sandbox left on the host', async () => (await api<{ nodes: NodeHeartbeat[] }>(cluster, admin, 'GET', '/v1/nodes')).body.nodes.find((n) => n.nodeId === NODE)?.sandboxes === 0, 30_000);
    const listed = (await api(cluster, token, 'GET', '/v1/sandboxes?limit=1000')).body.sandboxes as { state: string }[];
    expect(listed.length).toBeGreaterThan(0);
    expect(listed.filter((s) => s.state !== 'terminated')).toEqual([]);
  }, 60_000);
});
