import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { gunzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CHUNK_ENCODING_HEADER } from '../src/layers/index.ts';
import { api, startTestCluster, type TestCluster } from './support/cluster.ts';
import { tarOf, type TarEntry as Entry } from './support/tar.ts';

let cluster: TestCluster;
let token: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-l' }] });
  token = await cluster.token('builder', ['layer:write', 'sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
});
afterAll(async () => cluster?.stop());

const upload = (tar: Buffer, name?: string) =>
  api(cluster, token, 'POST', `/v1/layers${name ? `?name=${name}` : ''}`, new Uint8Array(tar), { 'content-type': 'application/x-tar' });

describe('layers', () => {
  it('turns a tar into an EROFS layer that sandboxes stack over the base', async () => {
    const tar = await tarOf([
      { name: 'workspace/', type: 'directory', mode: 0o755 },
      { name: 'workspace/README', content: 'task repo\n', mode: 0o644 },
      { name: 'workspace/run.sh', content: '#!/bin/sh\necho ran\n', mode: 0o755 },
      { name: 'workspace/link', type: 'symlink', linkname: 'README' },
    ]);
    const first = await upload(tar, 'workspace-a');
    expect(first.status, JSON.stringify(first.body)).toBe(201);
    expect(first.body).toMatchObject({ name: 'workspace-a', digest: expect.stringMatching(/^sha256:/) });
    expect((await upload(tar, 'workspace-a')).body.digest).toBe(first.body.digest); // content-addressed

    const listed = await api(cluster, token, 'GET', '/v1/layers');
    expect(listed.body.layers.map((l: { name: string }) => l.name)).toEqual(expect.arrayContaining(['busybox', 'workspace-a']));
    // A split layer: its metadata image and data blob make its size; the chunk table is its identity.
    const get = (file: string, headers: Record<string, string> = {}) => fetch(`${cluster.url}/v1/layers/workspace-a/${file}`, { headers: { authorization: `Bearer ${token}`, ...headers } });
    const [blob, meta, chunks] = await Promise.all(['blob', 'meta', 'chunks'].map((f) => get(f)));
    expect([blob!.status, meta!.status, chunks!.status]).toEqual([200, 200, 200]);
    const blobBytes = Buffer.from(await blob!.arrayBuffer());
    expect(blobBytes.length + (await meta!.arrayBuffer()).byteLength).toBe(first.body.sizeBytes);
    const tableBytes = Buffer.from(await chunks!.arrayBuffer());
    expect(`sha256:${createHash('sha256').update(tableBytes).digest('hex')}`).toBe(first.body.digest);
    expect(JSON.parse(tableBytes.toString())).toMatchObject({ chunkSizeBytes: 1048576, blob: { sizeBytes: blobBytes.length } });
    // Ranges, as hosts reading the layer on demand ask for them.
    const part = await get('blob', { range: 'bytes=10-19' });
    expect(part.status).toBe(206);
    expect(part.headers.get('content-range')).toBe(`bytes 10-19/${blobBytes.length}`);
    expect(Buffer.from(await part.arrayBuffer())).toEqual(blobBytes.subarray(10, 20));
    // Asked for gzip (as the hosts ask), the range comes gzipped: the same bytes once decoded.
    const whole = `bytes=0-${blobBytes.length - 1}`;
    const gzipped = await get('blob', { range: whole, [CHUNK_ENCODING_HEADER]: 'gzip' });
    expect([gzipped.status, gzipped.headers.get(CHUNK_ENCODING_HEADER), gzipped.headers.get('content-encoding'), gzipped.headers.get('content-range')]).toEqual([206, 'gzip', null, `bytes 0-${blobBytes.length - 1}/${blobBytes.length}`]);
    expect(gunzipSync(Buffer.from(await gzipped.arrayBuffer()))).toEqual(blobBytes);
    const plain = await get('blob', { range: whole });
    expect([plain.headers.get(CHUNK_ENCODING_HEADER), plain.headers.get('content-length')]).toEqual([null, String(blobBytes.length)]);
    await plain.arrayBuffer();
    const tail = await get('blob', { range: 'bytes=-5' });
    expect([tail.status, tail.headers.get('content-range')]).toEqual([206, `bytes ${blobBytes.length - 5}-${blobBytes.length - 1}/${blobBytes.length}`]);
    await tail.arrayBuffer();
    const past = await get('blob', { range: `bytes=${blobBytes.length}-` });
    expect([past.status, past.headers.get('content-range'), (await past.json()).error.code]).toEqual([416, `bytes */${blobBytes.length}`, 'range_not_satisfiable']);
    const busybox = await fetch(`${cluster.url}/v1/layers/busybox/meta`, { method: 'HEAD', headers: { authorization: `Bearer ${token}` } });
    expect(busybox.status).toBe(200);

    const sandbox = await api(cluster, token, 'POST', '/v1/sandboxes', { image: { base: 'busybox', layers: ['workspace-a'] } });
    expect(sandbox.status, JSON.stringify(sandbox.body)).toBe(201);
    const run = await api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.body.id}/exec`, { cmd: 'cat /workspace/link && /workspace/run.sh' });
    expect(run.body).toMatchObject({ exitCode: 0, stdout: 'task repo\nran\n' });
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandbox.body.id}`);
  });

  it('refuses tars that reach outside the layer, writing nothing outside the store', async () => {
    const canary = `rollbox-canary-${process.pid}`;
    const hostile: Entry[][] = [
      [{ name: `../../../../tmp/${canary}`, content: 'x' }],
      [{ name: `/tmp/${canary}`, content: 'x' }],
      [{ name: 'escape', type: 'symlink', linkname: '/tmp' }, { name: `escape/${canary}`, content: 'x' }],
      [{ name: 'up', type: 'symlink', linkname: '../../../../../tmp' }],
      [{ name: 'hard', type: 'link', linkname: '../../../../etc/passwd' }],
      [{ name: 'dev', type: 'character-device', devmajor: 1, devminor: 3 }],
    ];
    for (const entries of hostile) {
      const response = await upload(await tarOf(entries));
      expect(response.status, JSON.stringify(entries)).toBe(400);
      expect(response.body.error.code).toBe('invalid_layer');
    }
    expect(fs.existsSync(`/tmp/${canary}`)).toBe(false);
    expect(fs.existsSync(path.join(cluster.rootDir, canary))).toBe(false);
    const garbage = await upload(Buffer.from('this is not a tar archive at all'.repeat(40)));
    expect(garbage.status).toBe(400);
  });

  it('needs the layer:write scope to upload', async () => {
    const runtimeAgent = await cluster.token('agent', ['sandbox:create', 'sandbox:exec']);
    const response = await api(cluster, runtimeAgent, 'POST', '/v1/layers', new Uint8Array(await tarOf([{ name: 'a', content: 'b' }])), { 'content-type': 'application/x-tar' });
    expect(response.status).toBe(403);
  });
});
