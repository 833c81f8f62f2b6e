import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RollboxApiError, RollboxClient, SandboxFilesClient } from '../src/client/index.ts';
import { startTestCluster, type TestCluster } from './support/cluster.ts';

let cluster: TestCluster;
let client: RollboxClient;
let files: SandboxFilesClient;
let id: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-fm' }] });
  const token = await cluster.token('files-meta', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
  client = new RollboxClient({ baseUrl: cluster.url, token });
  files = new SandboxFilesClient(client);
  id = (await client.createSandbox({ ttlSeconds: 600 })).id;
});
afterAll(async () => {
  await cluster?.stop();
});

const codeOf = (p: Promise<unknown>) => p.then(() => 'ok', (err: unknown) => (err instanceof RollboxApiError ? err.code : String(err)));

describe('files: stat, list, mkdir, move, remove', () => {
  it('makes directories (mkdir -p), and says when one was there already', async () => {
    const made = await files.makeDir(id, '/work/a/b');
    expect(made).toMatchObject({ created: true, entry: { path: '/work/a/b', name: 'b', type: 'directory' } });
    expect((await files.makeDir(id, '/work/a/b')).created).toBe(false);
    await client.writeFile(id, '/work/a/file.txt', new TextEncoder().encode('hello'), { mode: '0640' });
    expect(await codeOf(files.makeDir(id, '/work/a/file.txt'))).toBe('invalid_request');
  });

  it('stats files, directories and symlinks without following them', async () => {
    await client.exec(id, { cmd: 'ln -s /work/a/file.txt /work/link' });
    const file = await files.stat(id, '/work/a/file.txt');
    expect(file).toMatchObject({ type: 'file', sizeBytes: 5, mode: 0o640, permissions: '-rw-r-----', owner: 'root', group: 'root' });
    expect(Date.parse(file.modifiedAt)).toBeGreaterThan(Date.now() - 120_000);
    expect(await files.stat(id, '/work/link')).toMatchObject({ type: 'symlink', symlinkTarget: '/work/a/file.txt' });
    expect(await codeOf(files.stat(id, '/work/missing'))).toBe('not_found');
  });

  it('lists a directory, to a depth', async () => {
    const top = await files.list(id, '/work');
    expect(top.map((e) => e.path).sort()).toEqual(['/work/a', '/work/link']);
    const deep = await files.list(id, '/work', 3);
    expect(deep.map((e) => e.path).sort()).toEqual(['/work/a', '/work/a/b', '/work/a/file.txt', '/work/link']);
    expect(await codeOf(files.list(id, '/work/a/file.txt'))).toBe('invalid_request');
    expect(await codeOf(files.list(id, '/nope'))).toBe('not_found');
  });

  it('moves (creating the destination\'s parents) and removes, idempotently', async () => {
    const moved = await files.move(id, '/work/a/file.txt', '/work/new/place.txt');
    expect(moved).toMatchObject({ path: '/work/new/place.txt', type: 'file', sizeBytes: 5 });
    expect(new TextDecoder().decode(await client.readFile(id, '/work/new/place.txt'))).toBe('hello');
    expect(await codeOf(files.move(id, '/work/a/file.txt', '/work/x'))).toBe('not_found');
    expect(await files.remove(id, '/work/a')).toEqual({ path: '/work/a', removed: true });
    expect(await files.remove(id, '/work/a')).toEqual({ path: '/work/a', removed: false });
    expect(await codeOf(files.stat(id, '/work/a'))).toBe('not_found');
  });

  it('names with spaces and tabs survive', async () => {
    await files.makeDir(id, '/work/with space/and\ttab');
    const entries = await files.list(id, '/work/with space');
    expect(entries.map((e) => e.name)).toEqual(['and\ttab']);
  });

  it('refuses relative paths before they reach a host', async () => {
    expect(await codeOf(files.stat(id, 'relative'))).toBe('invalid_request');
  });
});

describe('TTL', () => {
  it('moves a running sandbox\'s end sooner or later; the host ends it then', async () => {
    const later = await client.setTtl(id, 3600);
    expect(Date.parse(later.expiresAt!)).toBeGreaterThan(Date.now() + 3500_000);
    const short = (await client.createSandbox({ ttlSeconds: 600 })).id;
    const sooner = await client.setTtl(short, 1);
    expect(Date.parse(sooner.expiresAt!)).toBeLessThan(Date.now() + 5000);
    let state = sooner.state;
    for (let i = 0; i < 100 && state === 'running'; i++) {
      await new Promise((r) => setTimeout(r, 100));
      state = (await client.getSandbox(short)).state;
    }
    expect(await client.getSandbox(short)).toMatchObject({ state: 'failed', failureReason: 'timeout' });
    expect(await codeOf(client.setTtl(short, 60))).toBe('invalid_state');
  });
});
