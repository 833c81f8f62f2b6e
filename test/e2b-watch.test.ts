import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { Sandbox, type FilesystemEvent } from 'e2b';
import { Sandbox as OlderSandbox } from 'e2b-2-45';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

const run = promisify(execFile);
const REPO_ROOT = path.resolve(import.meta.dirname, '..');
let cluster: TestCluster;
const opened: { kill(): Promise<unknown> }[] = [];
const saved: NodeJS.ProcessEnv = { ...process.env };

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-e2b-watch' }], env: { ROLLBOX_E2B_BASE_TEMPLATE: 'off' } });
  const issued = await run(process.execPath, [path.join(REPO_ROOT, 'bin/rollbox.js'), 'e2b-key', 'issue', '--tenant', 'watch-team'], { env: { ...process.env, REDIS_URL: cluster.redisUrl } });
  Object.assign(process.env, { E2B_API_URL: cluster.url, E2B_SANDBOX_URL: cluster.url, E2B_API_KEY: issued.stdout.trim() });
});
afterAll(async () => {
  await Promise.allSettled(opened.map((s) => s.kill()));
  process.env = saved;
  await cluster?.stop();
});

/** Events seen so far, as `type name`. */
const seen = (events: FilesystemEvent[]) => events.map((e) => `${e.type} ${e.name}`);
/** The watcher commands running in the sandbox (its own busybox running the watch script). */
const watchers = async (sbx: Sandbox) => Number((await sbx.commands.run('grep -l "[e]cho ready" /proc/[0-9]*/cmdline 2>/dev/null | wc -l')).stdout.trim());

for (const [version, SandboxClass] of [
  ['2.51', Sandbox],
  ['2.45', OlderSandbox as unknown as typeof Sandbox],
] as const) {
  describe(`files.watchDir through the E2B SDK ${version}`, () => {
    let sbx: Sandbox;
    beforeAll(async () => {
      sbx = await SandboxClass.create({ timeoutMs: 120_000 });
      opened.push(sbx);
      await sbx.files.makeDir('/tmp/w/sub');
    });

    it('streams create, write, rename and remove; a subdirectory is not watched unless recursive; stop() ends the watcher', async () => {
      const events: FilesystemEvent[] = [];
      const handle = await sbx.files.watchDir('/tmp/w', (e) => void events.push(e));
      await sbx.files.write('/tmp/w/a.txt', 'hello');
      await waitFor('create and write of a.txt', async () => seen(events).includes('create a.txt') && seen(events).includes('write a.txt'));
      events.length = 0;
      await sbx.commands.run('echo more >> /tmp/w/a.txt');
      await waitFor('write of a.txt', async () => seen(events).includes('write a.txt'));
      await sbx.files.rename('/tmp/w/a.txt', '/tmp/w/b.txt');
      await waitFor('rename a.txt to b.txt', async () => seen(events).includes('rename a.txt') && seen(events).includes('create b.txt'));
      await sbx.files.write('/tmp/w/sub/deep.txt', 'deep');
      await sbx.files.remove('/tmp/w/b.txt');
      await waitFor('remove of b.txt', async () => seen(events).includes('remove b.txt'));
      // deep.txt was written before b.txt was removed: had it been reported, it would be by now.
      expect(seen(events).filter((e) => e.includes('deep'))).toEqual([]);
      expect(await watchers(sbx)).toBeGreaterThan(0);
      await handle.stop();
      await waitFor('the watcher to end', async () => (await watchers(sbx)) === 0);
      const count = events.length;
      await sbx.files.write('/tmp/w/after-stop.txt', 'x');
      await new Promise((r) => setTimeout(r, 600));
      expect(events.length).toBe(count);
    }, 60_000);

    it('watches subdirectories when recursive, with names relative to the watched directory', async () => {
      const events: FilesystemEvent[] = [];
      const handle = await sbx.files.watchDir('/tmp/w', (e) => void events.push(e), { recursive: true });
      await sbx.commands.run('mkdir -p /tmp/w/sub/new && echo x > /tmp/w/sub/new/f.txt');
      await waitFor('create of sub/new/f.txt', async () => seen(events).includes('create sub/new') && seen(events).includes('create sub/new/f.txt'));
      await handle.stop();
    }, 30_000);

    it('refuses a missing directory and a file as envd does', async () => {
      await expect(sbx.files.watchDir('/tmp/no/such', () => {})).rejects.toThrow(/not found/);
      await sbx.files.write('/tmp/plain.txt', 'x');
      await expect(sbx.files.watchDir('/tmp/plain.txt', () => {})).rejects.toMatchObject({ name: 'InvalidArgumentError', message: expect.stringMatching(/not a directory/) });
    }, 30_000);
  });
}

describe('the polling watcher RPCs (CreateWatcher, GetWatcherEvents, RemoveWatcher)', () => {
  let sbx: Sandbox;
  let other: Sandbox;
  const headersOf = (s: Sandbox) => ({ 'e2b-sandbox-id': s.sandboxId, 'x-access-token': (s as unknown as { envdAccessToken: string }).envdAccessToken, 'content-type': 'application/json', 'connect-protocol-version': '1' });
  const call = async (s: Sandbox, method: string, body: object) => {
    const res = await fetch(`${cluster.url}/filesystem.Filesystem/${method}`, { method: 'POST', headers: headersOf(s), body: JSON.stringify(body) });
    return { status: res.status, body: (await res.json()) as Record<string, unknown> };
  };
  beforeAll(async () => {
    [sbx, other] = await Promise.all([Sandbox.create({ timeoutMs: 120_000 }), Sandbox.create({ timeoutMs: 120_000 })]);
    opened.push(sbx, other);
    await sbx.files.makeDir('/tmp/p');
  });

  it('buffers events until drained, each event once, and ends the watcher on RemoveWatcher; another sandbox cannot reach it', async () => {
    const created = await call(sbx, 'CreateWatcher', { path: '/tmp/p', recursive: true });
    expect(created.status).toBe(200);
    const watcherId = created.body.watcherId as string;
    await sbx.commands.run('echo one > /tmp/p/one.txt && mkdir /tmp/p/d && echo two > /tmp/p/d/two.txt');
    const drained: string[] = [];
    await waitFor('the buffered events', async () => {
      const { body } = await call(sbx, 'GetWatcherEvents', { watcherId });
      drained.push(...(body.events as { type: string; name: string }[]).map((e) => `${e.type} ${e.name}`));
      return drained.includes('EVENT_TYPE_WRITE d/two.txt');
    });
    expect(drained).toEqual(expect.arrayContaining(['EVENT_TYPE_CREATE one.txt', 'EVENT_TYPE_WRITE one.txt', 'EVENT_TYPE_CREATE d', 'EVENT_TYPE_CREATE d/two.txt']));
    expect(new Set(drained).size).toBe(drained.length);
    expect((await call(sbx, 'GetWatcherEvents', { watcherId })).body).toEqual({ events: [] });

    // The watcher belongs to its sandbox: another sandbox's token (same tenant, even) does not find it.
    expect(await call(other, 'GetWatcherEvents', { watcherId })).toMatchObject({ status: 404, body: { code: 'not_found' } });
    expect(await call(other, 'RemoveWatcher', { watcherId })).toMatchObject({ status: 404 });
    // Nor does this sandbox's id with the other's token.
    const forged = await fetch(`${cluster.url}/filesystem.Filesystem/GetWatcherEvents`, { method: 'POST', headers: { ...headersOf(other), 'e2b-sandbox-id': sbx.sandboxId }, body: JSON.stringify({ watcherId }) });
    expect(forged.status).toBe(401);

    expect(await call(sbx, 'RemoveWatcher', { watcherId })).toEqual({ status: 200, body: {} });
    expect(await call(sbx, 'GetWatcherEvents', { watcherId })).toMatchObject({ status: 404, body: { code: 'not_found' } });
    await waitFor('the watcher to end', async () => (await watchers(sbx)) === 0);
    expect(await call(sbx, 'CreateWatcher', { path: '/tmp/none' })).toMatchObject({ status: 404, body: { code: 'not_found' } });
  }, 60_000);
});
