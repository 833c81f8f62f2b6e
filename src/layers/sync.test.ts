import { createHash } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fetchLayers } from './sync.ts';
import { LayerStore } from './store.ts';

const blob = Buffer.from('an erofs image, as far as this test cares');
const digest = `sha256:${createHash('sha256').update(blob).digest('hex')}`;
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'rollbox-sync-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** Serves `body` for every URL and records the requests (the gateway side is an outside system here). */
function serving(body: Buffer | undefined, seen: { url: string; auth: string | null }[] = []): typeof fetch {
  return (async (url: string, init?: RequestInit) => {
    seen.push({ url, auth: new Headers(init?.headers).get('authorization') });
    return body ? new Response(new Uint8Array(body)) : new Response('{"error":{"code":"not_found"}}', { status: 404 });
  }) as typeof fetch;
}

describe('fetchLayers', () => {
  it('downloads a blob with the token, checks its digest and stores it; a second sync fetches nothing', async () => {
    const store = new LayerStore(path.join(dir, 'ok'));
    const seen: { url: string; auth: string | null }[] = [];
    const options = { gatewayUrl: 'http://gw.test/', token: 'tok', store, tmpDir: path.join(dir, 'tmp'), fetchImpl: serving(blob, seen) };
    expect(await fetchLayers([digest], options)).toEqual([digest]);
    expect(seen).toEqual([{ url: `http://gw.test/v1/layers/${digest}/blob`, auth: 'Bearer tok' }]);
    expect(await readFile(store.pathOf(digest))).toEqual(blob);
    await fetchLayers([digest], options);
    expect(seen).toHaveLength(1);
  });

  it('refuses bytes that do not match the digest, and names a failed download', async () => {
    const store = new LayerStore(path.join(dir, 'bad'));
    const base = { gatewayUrl: 'http://gw.test', token: 't', store, tmpDir: path.join(dir, 'tmp') };
    await expect(fetchLayers([digest], { ...base, fetchImpl: serving(Buffer.from('tampered')) })).rejects.toMatchObject({ code: 'invalid_layer' });
    await expect(fetchLayers([digest], { ...base, fetchImpl: serving(undefined) })).rejects.toThrow(/answered 404/);
    expect(await store.has(digest)).toBe(false);
  });
});
