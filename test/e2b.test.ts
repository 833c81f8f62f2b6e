import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { AuthenticationError, CommandExitError, FileNotFoundError, Sandbox, SandboxNotFoundError, TimeoutError, type SandboxOpts } from 'e2b';
import { Sandbox as OlderSandbox } from 'e2b-2-45';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { envelope } from '../src/gateway/e2b/index.ts';
import { startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

const run = promisify(execFile);
const REPO_ROOT = path.resolve(import.meta.dirname, '..');
let cluster: TestCluster;
let apiKey: string;
let keyId: string;
const opened: Sandbox[] = [];
const saved: NodeJS.ProcessEnv = { ...process.env };

/** The real `rollbox` command (the CLI an operator issues keys with). */
const rollbox = (...args: string[]) => run(process.execPath, [path.join(REPO_ROOT, 'bin/rollbox.js'), ...args], { env: { ...process.env, REDIS_URL: cluster.redisUrl } });

beforeAll(async () => {
  // E2B's `base` is busybox here (no base template): test/e2b-parity.test.ts covers the template.
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-e2b' }], env: { ROLLBOX_E2B_BASE_TEMPLATE: 'off' } });
  const issued = await rollbox('e2b-key', 'issue', '--tenant', 'e2b-team', '--name', 'test');
  apiKey = issued.stdout.trim();
  keyId = /key id ([0-9a-f]+)/.exec(issued.stderr)![1]!;
  // As E2B's docs have it: the SDK reads these; code written for E2B runs unchanged.
  Object.assign(process.env, { E2B_API_URL: cluster.url, E2B_SANDBOX_URL: cluster.url, E2B_API_KEY: apiKey });
});
afterAll(async () => {
  await Promise.allSettled(opened.map((s) => s.kill()));
  process.env = saved;
  await cluster?.stop();
});

async function create(options: SandboxOpts = {}): Promise<Sandbox> {
  const sandbox = await Sandbox.create(options);
  opened.push(sandbox);
  return sandbox;
}

describe('E2B SDK (e2b 2.51) against rollbox', () => {
  let sbx: Sandbox;
  beforeAll(async () => {
    sbx = await create({ metadata: { run: 'e2b-test', stage: 'one' }, envs: { GREETING: 'hello' }, timeoutMs: 120_000 });
  });

  it('issues keys with an e2b_ shape and the SDK creates a sandbox with them', async () => {
    expect(apiKey).toMatch(/^e2b_[0-9a-f]{40}$/);
    expect(sbx.sandboxId).toMatch(/^sbx/);
    const { stdout } = await rollbox('e2b-key', 'list');
    expect(stdout).toContain(`${keyId}\te2b-team\t`);
  });

  it('runs commands with streaming stdout and stderr, create-time env and per-call env and cwd', async () => {
    const out: string[] = [];
    const err: string[] = [];
    const result = await sbx.commands.run('echo "$GREETING $WHO"; echo oops >&2; pwd', { envs: { WHO: 'world' }, cwd: '/tmp', onStdout: (d) => void out.push(d), onStderr: (d) => void err.push(d) });
    expect(result).toMatchObject({ exitCode: 0, stdout: 'hello world\n/tmp\n', stderr: 'oops\n' });
    expect(out.join('')).toBe('hello world\n/tmp\n');
    expect(err.join('')).toBe('oops\n');
  });

  it('maps E2B\'s users: root by name, relative paths under its home; a user the image lacks is a clear error', async () => {
    expect((await sbx.commands.run('id -un; pwd', { user: 'root', cwd: 'sub/..' })).stdout).toBe('root\n/root\n');
    await sbx.files.write('rel.txt', 'relative', { user: 'root' });
    expect(await sbx.files.read('/root/rel.txt')).toBe('relative');
    // busybox has no user `user` (E2B templates' default): the init says so, the SDK raises it.
    const missing = await sbx.commands.run('true', { user: 'user' }).catch((e: unknown) => e);
    expect(missing).toBeInstanceOf(CommandExitError);
    expect((missing as CommandExitError).stderr).toMatch(/unable to find user user/);
  });

  it('raises CommandExitError for a non-zero exit, with its output', async () => {
    const failed = await sbx.commands.run('echo partial; exit 3').catch((e: unknown) => e);
    expect(failed).toBeInstanceOf(CommandExitError);
    expect(failed).toMatchObject({ exitCode: 3, stdout: 'partial\n' });
  });

  it('runs a background command, lists it, re-attaches from a second handle, and waits for it', async () => {
    const handle = await sbx.commands.run('sleep 1; echo done-bg', { background: true });
    expect(handle.pid).toBeGreaterThan(0);
    const listed = await sbx.commands.list();
    expect(listed.map((p) => p.pid)).toContain(handle.pid);
    expect(listed.find((p) => p.pid === handle.pid)).toMatchObject({ cmd: '/bin/bash', args: ['-l', '-c', 'sleep 1; echo done-bg'] });
    const again = await sbx.commands.connect(handle.pid);
    const [first, second] = await Promise.all([handle.wait(), again.wait()]);
    expect(first).toMatchObject({ exitCode: 0, stdout: 'done-bg\n' });
    expect(second.stdout).toBe('done-bg\n');
    expect((await sbx.commands.list()).map((p) => p.pid)).not.toContain(handle.pid);
  });

  it('keeps a silent command alive with keepalives and kills it at its timeoutMs', async () => {
    const quiet = await sbx.commands.run('sleep 2; echo late', { timeoutMs: 20_000 });
    expect(quiet.stdout).toBe('late\n');
    const killed = await sbx.commands.run('sleep 30', { timeoutMs: 1500 }).catch((e: unknown) => e);
    expect(killed).toBeInstanceOf(TimeoutError);
  });

  it('feeds stdin to a command started with stdin: true, and closes it', async () => {
    const handle = await sbx.commands.run('read a; read b; echo "got $b $a"; cat', { background: true, stdin: true });
    await sbx.commands.sendStdin(handle.pid, 'first\n');
    await handle.sendStdin('second\nand the rest');
    await handle.closeStdin();
    expect(await handle.wait()).toMatchObject({ exitCode: 0, stdout: 'got second first\nand the rest' });
  });

  it('kills a running command; stdin to one started without it is refused', async () => {
    let seen = '';
    const handle = await sbx.commands.run('echo started; sleep 30; echo never', { background: true, onStdout: (data) => void (seen += data) });
    await expect(sbx.commands.sendStdin(handle.pid, 'x')).rejects.toThrow(/stdinOpen|not open|stdin/i);
    // Killed once it has printed (a kill that lands first is as right, with no output).
    await waitFor('started printed', async () => seen === 'started\n');
    expect(await sbx.commands.kill(handle.pid)).toBe(true);
    const ended = await handle.wait().catch((e: unknown) => e);
    expect(ended).toBeInstanceOf(CommandExitError);
    expect(ended).toMatchObject({ exitCode: 137, stdout: 'started\n' });
    expect(await sbx.commands.kill(handle.pid)).toBe(false);
    expect(await sbx.commands.kill(123_456_789)).toBe(false);
  });

  it('writes, reads, lists, stats, renames, makes and removes files', async () => {
    const info = await sbx.files.write('/work/notes/a.txt', 'first file');
    expect(info).toMatchObject({ path: '/work/notes/a.txt', name: 'a.txt' });
    await sbx.files.write([
      { path: '/work/notes/b.bin', data: new Uint8Array([0, 1, 2, 255]).buffer },
      { path: '/work/notes/c.txt', data: new Blob(['from a blob']) },
    ]);
    expect(await sbx.files.read('/work/notes/a.txt')).toBe('first file');
    expect(Array.from(await sbx.files.read('/work/notes/b.bin', { format: 'bytes' }))).toEqual([0, 1, 2, 255]);
    const entries = await sbx.files.list('/work/notes');
    expect(entries.map((e) => [e.name, e.type, e.size]).sort()).toEqual([
      ['a.txt', 'file', 10],
      ['b.bin', 'file', 4],
      ['c.txt', 'file', 11],
    ]);
    expect(await sbx.files.makeDir('/work/notes/sub/deeper')).toBe(true);
    expect(await sbx.files.makeDir('/work/notes/sub/deeper')).toBe(false);
    expect(await sbx.files.exists('/work/notes/sub')).toBe(true);
    expect((await sbx.files.getInfo('/work/notes/sub')).type).toBe('dir');
    await sbx.files.rename('/work/notes/a.txt', '/work/notes/sub/a.txt');
    expect(await sbx.files.exists('/work/notes/a.txt')).toBe(false);
    await sbx.files.remove('/work/notes/sub');
    expect(await sbx.files.exists('/work/notes/sub')).toBe(false);
    await expect(sbx.files.read('/work/notes/missing')).rejects.toBeInstanceOf(FileNotFoundError);
    // What the files API wrote, a command sees.
    expect((await sbx.commands.run('cat /work/notes/c.txt')).stdout).toBe('from a blob');
  });

  it('connects from a second client, extends the timeout, reports info and lists by metadata', async () => {
    const second = await Sandbox.connect(sbx.sandboxId);
    expect((await second.commands.run('echo from-second')).stdout).toBe('from-second\n');
    const before = await sbx.getInfo();
    // The default template `base` (busybox without the base template), as asked.
    expect(before).toMatchObject({ sandboxId: sbx.sandboxId, templateId: 'base', state: 'running', metadata: { run: 'e2b-test', stage: 'one' } });
    await sbx.setTimeout(600_000);
    const after = await sbx.getInfo();
    // connect extended it to 300 s from then; setTimeout makes it 600 s from now.
    expect(after.endAt.getTime()).toBeGreaterThan(before.endAt.getTime() + 250_000);
    expect(after.endAt.getTime()).toBeLessThan(Date.now() + 610_000);

    const other = await create({ metadata: { run: 'e2b-test', stage: 'two' } });
    const both = await Sandbox.list({ query: { metadata: { run: 'e2b-test' } } }).nextItems();
    expect(both.map((s) => s.sandboxId).sort()).toEqual([sbx.sandboxId, other.sandboxId].sort());
    const one = await Sandbox.list({ query: { metadata: { stage: 'two' } } }).nextItems();
    expect(one.map((s) => s.sandboxId)).toEqual([other.sandboxId]);
    const paged = Sandbox.list({ query: { metadata: { run: 'e2b-test' } }, limit: 1 });
    const pages = [await paged.nextItems()];
    expect(paged.hasNext).toBe(true);
    pages.push(await paged.nextItems());
    expect(paged.hasNext).toBe(false);
    expect(pages.flat().length).toBe(2);
  });

  it('pauses (freezer) and connect resumes', async () => {
    const paused = await create();
    await paused.files.write('/kept', 'state');
    expect(await paused.pause()).toBe(true);
    expect((await paused.getInfo()).state).toBe('paused');
    expect(await Sandbox.pause(paused.sandboxId)).toBe(false);
    const back = await Sandbox.connect(paused.sandboxId);
    expect((await back.getInfo()).state).toBe('running');
    expect((await back.commands.run('cat /kept')).stdout).toBe('state');
  });

  it('kills a sandbox; commands in it then fail with the SDK\'s own error type, and kill again says false', async () => {
    const doomed = await create();
    expect(await doomed.isRunning()).toBe(true);
    await doomed.kill();
    expect(await doomed.isRunning()).toBe(false);
    // The SDK's own reading of a sandbox that is gone (envd unavailable / the proxy's 502).
    await expect(doomed.commands.run('echo never')).rejects.toBeInstanceOf(SandboxNotFoundError);
    await expect(doomed.files.read('/etc/hostname')).rejects.toBeInstanceOf(TimeoutError);
    expect(await Sandbox.kill(doomed.sandboxId)).toBe(false);
    await expect(Sandbox.connect(doomed.sandboxId)).rejects.toThrow(/not found/);
  });

  it('refuses a wrong API key with a 401 in E2B\'s shape, and a revoked key', async () => {
    await expect(Sandbox.create({ apiKey: `e2b_${'0'.repeat(40)}` })).rejects.toBeInstanceOf(AuthenticationError);
    const raw = await fetch(`${cluster.url}/v2/sandboxes`, { headers: { 'x-api-key': 'e2b_deadbeef' } });
    expect(raw.status).toBe(401);
    expect(await raw.json()).toEqual({ code: 401, message: expect.stringMatching(/Invalid API key/) });
    const spare = await rollbox('e2b-key', 'issue', '--tenant', 'e2b-team');
    const spareId = /key id ([0-9a-f]+)/.exec(spare.stderr)![1]!;
    const spareKey = spare.stdout.trim();
    expect((await fetch(`${cluster.url}/v2/sandboxes`, { headers: { 'x-api-key': spareKey } })).status).toBe(200);
    await rollbox('e2b-key', 'revoke', spareId);
    await new Promise((r) => setTimeout(r, 5100)); // the gateway's verified-key cache
    expect((await fetch(`${cluster.url}/v2/sandboxes`, { headers: { 'x-api-key': spareKey } })).status).toBe(401);
  });

  it('checks the envd access token', async () => {
    const wrong = await fetch(`${cluster.url}/filesystem.Filesystem/Stat`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'e2b-sandbox-id': sbx.sandboxId, 'x-access-token': 'ZTJi.0000' },
      body: JSON.stringify({ path: '/' }),
    });
    expect(wrong.status).toBe(401);
    expect(await wrong.json()).toMatchObject({ code: 'unauthenticated' });
  });

  it('runs through an older SDK (e2b 2.45, the /v1 create and connect)', async () => {
    const old = await OlderSandbox.create();
    try {
      expect((await old.commands.run('echo old-sdk')).stdout).toBe('old-sdk\n');
      await old.files.write('/old.txt', 'x');
      expect(await old.files.read('/old.txt')).toBe('x');
      const again = await OlderSandbox.connect(old.sandboxId);
      expect((await again.getInfo()).sandboxId).toBe(old.sandboxId);
    } finally {
      await old.kill();
    }
  });
});

async function waitUntil(probe: () => Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  for (const until = Date.now() + timeoutMs; !(await probe()); ) {
    if (Date.now() > until) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('bad input on the envd surface', () => {
  let sbx: Sandbox;
  let headers: Record<string, string>;
  beforeAll(async () => {
    sbx = await create();
    const token = (sbx as unknown as { envdAccessToken?: string }).envdAccessToken;
    headers = { 'e2b-sandbox-id': sbx.sandboxId, 'x-access-token': token ?? '', 'connect-protocol-version': '1' };
  });
  const post = (method: string, body: BodyInit, contentType: string) => fetch(`${cluster.url}/${method}`, { method: 'POST', headers: { ...headers, 'content-type': contentType }, body });
  /** Every frame of a stream answer: flags and message. */
  const framesOf = async (res: Response) => {
    const bytes = Buffer.from(await res.arrayBuffer());
    const frames: { flags: number; message: Record<string, unknown> }[] = [];
    for (let at = 0; at < bytes.length; ) {
      const length = bytes.readUInt32BE(at + 1);
      frames.push({ flags: bytes[at]!, message: JSON.parse(bytes.subarray(at + 5, at + 5 + length).toString()) as Record<string, unknown> });
      at += 5 + length;
    }
    return frames;
  };

  it('takes stdin as a client stream (StreamInput): each piece reaches the command as it arrives', async () => {
    const handle = await sbx.commands.run('read a; echo "one $a"; read b; echo "two $b"', { background: true, stdin: true });
    const ended = handle.wait();
    let push!: (frame: Uint8Array | null) => void;
    const body = new ReadableStream<Uint8Array>({ start: (controller) => void (push = (frame) => (frame ? controller.enqueue(frame) : controller.close())) });
    const answer = fetch(`${cluster.url}/process.Process/StreamInput`, { method: 'POST', headers: { ...headers, 'content-type': 'application/connect+json' }, body, duplex: 'half' } as RequestInit);
    push(envelope({ start: { process: { pid: handle.pid } } }));
    push(envelope({ data: { input: { stdin: Buffer.from('first\n').toString('base64') } } }));
    // The first piece is read before the stream ends: the command answers it meanwhile.
    await waitUntil(async () => handle.stdout.includes('one first'));
    push(envelope({ keepalive: {} }));
    push(envelope({ data: { input: { stdin: Buffer.from('second\n').toString('base64') } } }));
    push(envelope({}, 0x02));
    push(null);
    const res = await answer;
    expect(res.status).toBe(200);
    expect((await framesOf(res)).map((f) => f.flags)).toEqual([0, 2]);
    expect(await ended).toMatchObject({ exitCode: 0, stdout: 'one first\ntwo second\n' });
    // Data before a start: a Connect error in the end-of-stream frame.
    const bad = await post('process.Process/StreamInput', new Uint8Array(envelope({ data: { input: { stdin: 'eA==' } } })), 'application/connect+json');
    expect((await framesOf(bad)).at(-1)!.message).toMatchObject({ error: { code: 'invalid_argument' } });
  });

  it('answers malformed, compressed, oversized and mistyped frames with Connect codes', async () => {
    const start = { process: { cmd: '/bin/sh', args: ['-c', 'true'] } };
    const good = Buffer.from(envelope(start));
    for (const [body, code] of [
      [good.subarray(0, 3), 'invalid_argument'],
      [Buffer.concat([good, Buffer.from('extra')]), 'invalid_argument'],
      [Buffer.from([1, ...good.subarray(1)]), 'unimplemented'],
      [Buffer.from(envelope({ process: { cmd: '' } })), 'invalid_argument'],
      [Buffer.concat([Buffer.from([0, 0, 0, 0, 9]), Buffer.from('not json!')]), 'invalid_argument'],
    ] as const) {
      const res = await post('process.Process/Start', new Uint8Array(body), 'application/connect+json');
      expect(res.status).toBeGreaterThanOrEqual(400);
      expect((await res.json()) as unknown).toMatchObject({ code });
    }
    const huge = Buffer.alloc(5 + 5 * 1024 * 1024, 0x20);
    huge.writeUInt32BE(huge.length - 5, 1);
    const big = await post('process.Process/Start', new Uint8Array(huge), 'application/connect+json');
    expect(await big.json()).toMatchObject({ code: 'resource_exhausted' });
    expect(await (await post('process.Process/List', 'not json', 'application/json')).json()).toMatchObject({ code: 'invalid_argument' });
    expect(await (await post('process.Process/List', '{}', 'text/plain')).json()).toMatchObject({ code: 'invalid_argument' });
    const bigCreate = await fetch(`${cluster.url}/v2/sandboxes`, { method: 'POST', headers: { 'x-api-key': apiKey, 'content-type': 'application/json' }, body: JSON.stringify({ metadata: { x: 'y'.repeat(2 * 1024 * 1024) } }) });
    expect(bigCreate.status).toBe(413);
    expect(await bigCreate.json()).toMatchObject({ code: 413 });
    const badCreate = await fetch(`${cluster.url}/v2/sandboxes`, { method: 'POST', headers: { 'x-api-key': apiKey, 'content-type': 'application/json' }, body: '{"templateID": 7' });
    expect(await badCreate.json()).toMatchObject({ code: 400 });
  });

  it('answers unknown methods and services with unimplemented; a stream error travels in the end frame', async () => {
    const unknown = await post('process.Process/Explode', '{}', 'application/json');
    expect(unknown.status).toBe(501);
    expect(await unknown.json()).toMatchObject({ code: 'unimplemented' });
    const unwatchable = await post('filesystem.Filesystem/WatchDir', new Uint8Array(envelope({ path: '/no/such/dir' })), 'application/connect+json');
    expect((await framesOf(unwatchable)).at(-1)).toMatchObject({ flags: 2, message: { error: { code: 'not_found' } } });
    expect((await fetch(`${cluster.url}/nosuch.Service/Call`, { method: 'POST', headers })).status).toBe(404);
    const missingTag = await post('process.Process/Connect', new Uint8Array(envelope({ process: { tag: 'nope' } })), 'application/connect+json');
    expect(await missingTag.json()).toMatchObject({ code: 'not_found' });
    // The SDK still works after all of that.
    expect((await sbx.commands.run('echo still-fine')).stdout).toBe('still-fine\n');
    const res = await post('process.Process/Start', new Uint8Array(envelope({ process: { cmd: '/bin/sh', args: ['-c', 'exit 0'], cwd: '/no/such/dir' } })), 'application/connect+json');
    expect(res.status).toBe(200);
    const frames = await framesOf(res);
    expect(frames.at(-1)!.flags).toBe(2);
    expect(frames.slice(0, -1).every((f) => f.flags === 0)).toBe(true);
    // Either the stream ends in an error, or the command's end event says it failed.
    const failed = JSON.stringify(frames).match(/"exitCode":([1-9]\d*|-1)|"error"/);
    expect(failed).not.toBeNull();
  });
});

// The full size is 50x20 (ROLLBOX_E2B_MANY=50x20); the default keeps the suite quick on 2 cores.
const [MANY_SANDBOXES, MANY_COMMANDS] = (process.env.ROLLBOX_E2B_MANY ?? '10x10').split('x').map(Number) as [number, number];

describe('many sandboxes at once through one SDK process', () => {
  it(`${MANY_SANDBOXES} sandboxes x ${MANY_COMMANDS} commands, all at once: every command answers, nothing hangs`, async () => {
    const sandboxes = await Promise.all(Array.from({ length: MANY_SANDBOXES }, () => create()));
    const results = await Promise.all(sandboxes.flatMap((s, i) => Array.from({ length: MANY_COMMANDS }, (_, j) => s.commands.run(`echo ${i}-${j}`).then((r) => r.stdout))));
    expect(results.sort()).toEqual(sandboxes.flatMap((_, i) => Array.from({ length: MANY_COMMANDS }, (_, j) => `${i}-${j}\n`)).sort());
    await Promise.all(sandboxes.map((s) => s.kill()));
  }, 180_000);
});
