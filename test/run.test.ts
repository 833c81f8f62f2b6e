import { execFileSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NodeHeartbeat, RunCodeResponse, RunResult } from '../src/api/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

/**
 * The function-call tier, POST /v1/run: one command in a fresh sandbox, its outcome in one
 * of four classes; and SandboxFusion's POST /run_code on top of it, with bash (the busybox
 * image's sh) and real Python (a layer of this host's Debian python3.11).
 */
const LANGUAGES = {
  python: { image: { base: 'busybox', layers: ['test-python'] }, argv: ['/usr/bin/python3.11', '-I'], file: 'main.py', memoryMiB: 128 },
  bash: { image: { base: 'busybox', layers: [] }, argv: ['sh'], file: 'main.sh', memoryMiB: 64 },
};
const NODE = 'node-run1';
let cluster: TestCluster;
let token: string;
let admin: string;

beforeAll(async () => {
  // Room for a few small sandboxes only: a larger one is a platform refusal (no capacity).
  cluster = await startTestCluster({ workers: [{ nodeId: NODE, env: { ROLLBOX_NODE_MEMORY_MIB: '1024' } }], env: { ROLLBOX_RUN_CODE_LANGUAGES: JSON.stringify(LANGUAGES) } });
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

  it('fetches files back, small ones in its answer and large ones by a transfer key', async () => {
    const r = await run({ cmd: 'echo small > small.txt; head -c 3000000 /dev/zero | tr "\\0" a > big.txt', fetch: ['small.txt', 'big.txt', 'missing.txt'] });
    expect(r.body.status, JSON.stringify(r.body).slice(0, 500)).toBe('ok');
    expect(Object.keys(r.body.files).sort()).toEqual(['big.txt', 'small.txt']);
    expect(Buffer.from(r.body.files['small.txt']!, 'base64').toString()).toBe('small\n');
    const big = Buffer.from(r.body.files['big.txt']!, 'base64');
    expect([big.length, big.every((b) => b === 0x61)]).toEqual([3_000_000, true]);
  });

  it('keeps failed, timeout and infra_error apart', async () => {
    const failed = await run({ cmd: 'echo oops >&2; exit 3' });
    expect(failed.body).toMatchObject({ status: 'failed', exitCode: 3, stderr: 'oops\n' });
    const timeout = await run({ cmd: 'echo started; sleep 30', timeoutMs: 300 });
    expect(timeout.body).toMatchObject({ status: 'timeout', exitCode: null, stdout: 'started\n' });
    // More memory reserved than any host has room for: the platform cannot serve it now (safe to retry).
    const infra = await run({ cmd: 'true', resources: { memoryMiB: 4096, diskMiB: 64, requests: { memoryMiB: 4096 } } });
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

describe('POST /run_code (SandboxFusion)', () => {
  const runCode = (body: object, headers: Record<string, string> = { authorization: `Bearer ${token}` }, query = '') =>
    api<RunCodeResponse>({ url: cluster.url }, undefined, 'POST', `/run_code${query}`, { language: 'bash', ...body }, headers);

  beforeAll(async () => {
    // Python as Debian ships it: the interpreter, the libraries it links, its standard library.
    const tar = execFileSync('tar', ['-C', '/', '-chf', '-', '--exclude=__pycache__', '--exclude=dist-packages', '--exclude=site-packages', '--exclude=test', 'usr/bin/python3.11', 'usr/lib/python3.11', 'lib64/ld-linux-x86-64.so.2', ...['libc.so.6', 'libm.so.6', 'libz.so.1', 'libexpat.so.1'].map((l) => `lib/x86_64-linux-gnu/${l}`)], { maxBuffer: 512 * 1024 * 1024 });
    const layer = await api(cluster, await cluster.token('ops', ['layer:write']), 'POST', '/v1/layers?name=test-python', new Uint8Array(tar), { 'content-type': 'application/x-tar' });
    expect(layer.status, JSON.stringify(layer.body)).toBe(201);
    // The operator publishes what its language table names, so every tenant's run reads it.
    const published = await api(cluster, admin, 'PUT', '/v1/layers/test-python/published');
    expect(published.status, JSON.stringify(published.body)).toBe(200);
  }, 120_000);

  it("answers in SandboxFusion's shape: Success, Failed (exit or time limit), with stdin, files and fetched files", async () => {
    const ok = await runCode({ code: 'read x; echo "got $x"; cat in.txt > out.txt; echo warn >&2', stdin: 'hi\n', files: { 'in.txt': b64('data'), skipped: null }, fetch_files: ['out.txt', 'missing.txt', '/tmp'] });
    expect(ok.status).toBe(200);
    expect(ok.body).toMatchObject({ status: 'Success', message: '', compile_result: null, run_result: { status: 'Finished', return_code: 0, stdout: 'got hi\n', stderr: 'warn\n' }, files: { 'out.txt': b64('data') } });
    expect(Object.keys(ok.body.files)).toEqual(['out.txt']);
    expect(ok.body.run_result!.execution_time).toBeGreaterThan(0);
    const failed = await runCode({ code: 'echo no; exit 2' });
    expect(failed.body).toMatchObject({ status: 'Failed', run_result: { status: 'Finished', return_code: 2, stdout: 'no\n' } });
    const slow = await runCode({ code: 'sleep 30', run_timeout: 0.3 });
    expect(slow.body).toMatchObject({ status: 'Failed', run_result: { status: 'TimeLimitExceeded', return_code: null } });
  });

  it('runs Python from its image, as verl sends it', async () => {
    const verl = { code: 'import sys\nprint(sum(map(int, sys.stdin.read().split())))', language: 'python', compile_timeout: 10, run_timeout: 10, memory_limit_MB: 256, stdin: '1 2 3\n', files: {}, fetch_files: [] };
    const r = await runCode(verl, { 'content-type': 'application/json', accept: 'application/json', authorization: `Bearer ${token}` });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body).toMatchObject({ status: 'Success', run_result: { status: 'Finished', return_code: 0, stdout: '6\n' } });
    const raised = await runCode({ ...verl, code: 'raise SystemExit(7)' });
    expect(raised.body).toMatchObject({ status: 'Failed', run_result: { return_code: 7 } });
  });

  it('takes the token from the URL (verl cannot add a header), and refuses what it cannot run with clear errors', async () => {
    expect((await runCode({ code: 'echo q' }, {}, `?token=${token}`)).body.status).toBe('Success');
    const basic = Buffer.from(`verl:${token}`).toString('base64');
    expect((await runCode({ code: 'echo b' }, { authorization: `Basic ${basic}` })).body.status).toBe('Success');
    expect((await runCode({ code: 'echo x' }, {})).status).toBe(401);
    const unknown = await runCode({ code: 'x', language: 'cobol' });
    expect(unknown.status).toBe(400);
    expect((unknown.body as any).error.code).toBe('invalid_request');
    expect((unknown.body as any).error.message).toContain('bash, python');
    const climbing = await runCode({ code: 'x', files: { '../../etc/passwd': b64('x') } });
    expect(climbing.status).toBe(400);
    const huge = await runCode({ code: 'x'.repeat(20 * 1024 * 1024) });
    expect(huge.status).toBe(413);
    // Every run's sandbox is gone.
    await waitFor('no sandbox left on the host', async () => (await api<{ nodes: NodeHeartbeat[] }>(cluster, admin, 'GET', '/v1/nodes')).body.nodes.find((n) => n.nodeId === NODE)?.sandboxes === 0, 30_000);
  });
});
