import { createHash } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chunkTableOf } from './split.ts';
import { fetchLayers } from './sync.ts';
import { LayerStore } from './store.ts';

const image = Buffer.from('an erofs image, as far as this test cares');
const imageDigest = `sha256:${createHash('sha256').update(image).digest('hex')}`;
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'rollbox-sync-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** Serves `files` by the last path segment of the URL (chunks, meta, blob) and records the requests (the gateway side is an outside system here). */
function serving(files: Partial<Record<string, Buffer>>, seen: { url: string; auth: string | null }[] = []): typeof fetch {
  return (async (url: string, init?: RequestInit) => {
    seen.push({ url, auth: new Headers(init?.headers).get('authorization') });
    const body = files[url.split('/').at(-1)!];
    return body ? new Response(new Uint8Array(body)) : new Response('{"error":{"code":"not_found"}}', { status: 404 });
  }) as typeof fetch;
}

describe('fetchLayers', () => {
  it('downloads a single-image layer with the token, checks its digest and stores it; a second sync fetches nothing', async () => {
    const store = new LayerStore(path.join(dir, 'ok'));
    const seen: { url: string; auth: string | null }[] = [];
    const options = { gatewayUrl: 'http://gw.test/', token: 'tok', store, tmpDir: path.join(dir, 'tmp'), fetchImpl: serving({ blob: image }, seen) };
    expect(await fetchLayers([imageDigest], options)).toEqual([imageDigest]);
    expect(seen).toEqual([
      { url: `http://gw.test/v1/layers/${imageDigest}/chunks`, auth: 'Bearer tok' },
      { url: `http://gw.test/v1/layers/${imageDigest}/blob`, auth: 'Bearer tok' },
    ]);
    expect(await readFile(store.imagePathOf(imageDigest))).toEqual(image);
    await fetchLayers([imageDigest], options);
    expect(seen).toHaveLength(2);
  });

  it('downloads a split layer and checks its table, meta and every chunk', async () => {
    const chunk = 4096;
    const meta = Buffer.from('metadata image bytes');
    const blob = Buffer.concat([Buffer.alloc(chunk, 1), Buffer.alloc(chunk, 2), Buffer.alloc(100, 3)]);
    await writeFile(path.join(dir, 'm'), meta);
    await writeFile(path.join(dir, 'b'), blob);
    const table = await chunkTableOf(path.join(dir, 'm'), path.join(dir, 'b'), chunk);
    const digest = `sha256:${createHash('sha256').update(table).digest('hex')}`;
    expect(JSON.parse(table.toString()).chunks).toHaveLength(3);
    const base = { gatewayUrl: 'http://gw.test', token: 't', tmpDir: path.join(dir, 'tmp') };

    const store = new LayerStore(path.join(dir, 'split'));
    await fetchLayers([digest], { ...base, store, fetchImpl: serving({ chunks: table, meta, blob }) });
    const files = await store.locate(digest);
    expect(files).toMatchObject({ digest, blobPath: expect.stringMatching(/\.blob$/) });
    expect(await readFile(files!.imagePath)).toEqual(meta);
    expect(await readFile(files!.blobPath!)).toEqual(blob);
    expect(await store.chunkTable(digest)).toEqual(table);

    const tampered = Buffer.from(blob);
    tampered[chunk + 7] = 9;
    const bad = new LayerStore(path.join(dir, 'split-bad'));
    await expect(fetchLayers([digest], { ...base, store: bad, fetchImpl: serving({ chunks: table, meta, blob: tampered }) })).rejects.toThrow(/chunk 1 of its blob does not match/);
    await expect(fetchLayers([digest], { ...base, store: bad, fetchImpl: serving({ chunks: table, meta, blob: blob.subarray(0, chunk) }) })).rejects.toMatchObject({ code: 'invalid_layer' });
    await expect(fetchLayers([digest], { ...base, store: bad, fetchImpl: serving({ chunks: table, meta: Buffer.from('other meta'), blob }) })).rejects.toThrow(/metadata image does not match/);
    await expect(fetchLayers([digest], { ...base, store: bad, fetchImpl: serving({ chunks: Buffer.concat([table, Buffer.from(' ')]), meta, blob }) })).rejects.toThrow(/chunk table of .* hash to/);
    expect(await bad.has(digest)).toBe(false);
  });

  it('refuses bytes that do not match the digest, and names a failed download', async () => {
    const store = new LayerStore(path.join(dir, 'bad'));
    const base = { gatewayUrl: 'http://gw.test', token: 't', store, tmpDir: path.join(dir, 'tmp') };
    await expect(fetchLayers([imageDigest], { ...base, fetchImpl: serving({ blob: Buffer.from('tampered') }) })).rejects.toMatchObject({ code: 'invalid_layer' });
    await expect(fetchLayers([imageDigest], { ...base, fetchImpl: serving({}) })).rejects.toThrow(/answered 404/);
    expect(await store.has(imageDigest)).toBe(false);
  });
});
