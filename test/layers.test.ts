import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
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
    const blob = await fetch(`${cluster.url}/v1/layers/workspace-a/blob`, { headers: { authorization: `Bearer ${token}` } });
    expect(blob.status).toBe(200);
    expect((await blob.arrayBuffer()).byteLength).toBe(first.body.sizeBytes);

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
