import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Scope } from '../src/api/index.ts';
import type { WorkerHandle } from '../src/main.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { gatesUnder, hostTraces } from './support/host.ts';
import { tarOf } from './support/tar.ts';

const MiB = 1024 * 1024;
const SCOPES: Scope[] = ['sandbox:create', 'sandbox:read', 'sandbox:delete', 'sandbox:exec', 'layer:write'];
const NODE = 'lazy-cache';

let cluster: TestCluster;
let token: string;
let worker: WorkerHandle;
const digests: Record<string, string> = {};

async function upload(name: string, bytes: number): Promise<void> {
  const tar = await tarOf([{ name: `${name}/data.bin`, content: randomBytes(bytes) as unknown as string }]);
  const r = await api(cluster, token, 'POST', `/v1/layers?name=${name}`, new Uint8Array(tar), { 'content-type': 'application/x-tar' });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  digests[name] = r.body.digest;
}

const create = (layer: string) => api(cluster, token, 'POST', '/v1/sandboxes', { image: { base: 'busybox', layers: [layer] }, resources: { memoryMiB: 64 } });
const read = async (id: string, layer: string) => (await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd: `cat /${layer}/data.bin | wc -c` })).body;
const files = (layer: string) => fs.readdirSync(path.join(cluster.rootDir, NODE, 'worker', 'lazy')).filter((n) => n.startsWith(digests[layer]!.slice(7))).map((n) => n.slice(65)).sort();

beforeAll(async () => {
  cluster = await startTestCluster({ env: { ROLLBOX_NODE_IDLE_UNMOUNT_MS: '100', ROLLBOX_PLACEMENT_MAX_REFUSALS: '1' } });
  token = await cluster.token('cache', SCOPES);
  await upload('a', 5 * MiB);
  await upload('b', 5 * MiB);
  await upload('huge', 24 * MiB);
  worker = await cluster.addWorker({
    nodeId: NODE,
    env: {
      ROLLBOX_LAYER_STORE: path.join(cluster.rootDir, NODE, 'own-layers'),
      ROLLBOX_GATEWAY_URL: cluster.url,
      ROLLBOX_GATEWAY_TOKEN: await cluster.token('host', ['layer:host']),
      ROLLBOX_LAYER_CACHE_MAX_MIB: '10',
      ROLLBOX_LAZY_PREFETCH: 'off',
    },
  });
});

afterAll(async () => {
  await cluster?.stop();
  expect(hostTraces(cluster.rootDir)).toEqual({ mounts: [], loops: [], containers: [] });
  expect(gatesUnder(cluster.rootDir)).toEqual([]);
});

describe('the chunk cache of lazy layers', () => {
  it('refuses a sandbox whose lazy layers cannot fit the cache (admission), naming why', async () => {
    const r = await create('huge');
    expect(r.status).toBe(503);
    expect(r.body.error.code).toBe('admission_exhausted');
    const failed = (await api(cluster, token, 'GET', '/v1/sandboxes?state=failed')).body.sandboxes;
    expect(JSON.stringify(failed)).toMatch(/layer cache: .* > 10 MiB limit/);
  });

  it('evicts the data of the least recently used layer no sandbox mounts, keeps its metadata, and fetches it again when read', async () => {
    const a = await create('a');
    expect(a.status, JSON.stringify(a.body)).toBe(201);
    expect((await read(a.body.id, 'a')).stdout.trim()).toBe(String(5 * MiB));
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${a.body.id}`);
    expect(files('a')).toEqual(['chunks', 'data', 'map', 'meta']);
    // Its layers unmount once idle (a mounted layer counts at its whole size in admission).
    await waitFor('a unmounted', async () => !fs.readFileSync('/proc/mounts', 'utf8').includes(digests.a!.slice(7)));

    const b = await create('b');
    expect(b.status, JSON.stringify(b.body)).toBe(201);
    expect((await read(b.body.id, 'b')).stdout.trim()).toBe(String(5 * MiB));
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${b.body.id}`);
    // Past 10 MiB once b is let go: a (the least recently used) loses its data.
    await waitFor("a's data evicted", async () => files('a').join() === 'chunks,meta');
    expect(files('b')).toEqual(['chunks', 'data', 'map', 'meta']);
    expect(await worker.lazy!.usedBytes()).toBeLessThanOrEqual(10 * MiB);

    const fetched = worker.lazy!.fetchedBytes;
    const again = await create('a');
    expect((await read(again.body.id, 'a')).stdout.trim()).toBe(String(5 * MiB));
    expect(worker.lazy!.fetchedBytes - fetched).toBeGreaterThanOrEqual(5 * MiB);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${again.body.id}`);
  });
});
