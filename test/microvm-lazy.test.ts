import type { ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { gatesUnder, hostTraces } from './support/host.ts';
import { OriginProxy } from './support/origin-proxy.ts';
import { qemuPidsUnder } from './support/qemu.ts';
import { tarOf } from './support/tar.ts';

/**
 * Lazy (on-demand) layers read by microVMs: a host without the layer store mounts nothing
 * for a VM; its QEMU reads the layer's blob, the sparse file of the host's chunk cache,
 * through virtio-blk, and the gate's fanotify mark on that file holds each read of a chunk
 * the cache lacks until it is fetched from the origin (this test's proxy in front of the
 * gateway), checked by digest and written into the file, for every sandbox of the host. A
 * failed fetch is the guest's I/O error (EIO), never zeros, and the VM runs on. Real QEMU
 * (TCG here), gate, gateway and worker process.
 */
const MiB = 1024 * 1024;
const FILES = 24;
const FILE_BYTES = 2 * MiB;
const NODE = 'vmlazy';
const EIO_MESSAGE = /Input\/output error/;

let cluster: TestCluster;
let proxy: OriginProxy;
let token: string;
let worker: ChildProcess;
let startWorker: () => Promise<void>;
const sums: string[] = [];
let digest: string;
const fileStartedMs = Date.now();

const file = (i: number) => `/data/f${String(i).padStart(3, '0')}.bin`;
const cacheDir = () => path.join(cluster.rootDir, NODE, 'worker', 'lazy');

beforeAll(async () => {
  cluster = await startTestCluster({ env: { ROLLBOX_NODE_LOST_AFTER_MS: '15000', ROLLBOX_NODE_IDLE_UNMOUNT_MS: '200' } });
  token = await cluster.token('vmlazy', ['sandbox:create', 'sandbox:read', 'sandbox:delete', 'sandbox:exec', 'layer:write']);
  const hostToken = await cluster.token('host', ['layer:host']);
  const adminToken = await cluster.token('admin', ['admin']);
  proxy = await new OriginProxy(cluster.url).start();
  const data = Array.from({ length: FILES }, () => randomBytes(FILE_BYTES));
  for (const d of data) sums.push(createHash('sha256').update(d).digest('hex'));
  const tar = await tarOf([{ name: 'data/', type: 'directory', mode: 0o755 }, ...data.map((content, i) => ({ name: file(i).slice(1), content: content as unknown as string }))]);
  const uploaded = await api(cluster, token, 'POST', '/v1/layers?name=vmbig', new Uint8Array(tar), { 'content-type': 'application/x-tar' });
  expect(uploaded.status, JSON.stringify(uploaded.body)).toBe(201);
  digest = uploaded.body.digest;
  startWorker = async () => {
    const since = Date.now();
    // Its own (empty) layer store: every layer, busybox's too, comes from the origin on demand.
    worker = await cluster.spawnWorker({
      nodeId: NODE,
      env: {
        ROLLBOX_LAYER_STORE: path.join(cluster.rootDir, NODE, 'own-layers'),
        ROLLBOX_GATEWAY_URL: proxy.url,
        ROLLBOX_GATEWAY_TOKEN: hostToken,
        ROLLBOX_LAZY_GRACE_MS: '1500',
        // Reads are counted exactly: nothing fetched ahead.
        ROLLBOX_LAZY_PREFETCH: 'record',
      },
    });
    // Heartbeats of this process, once started (the first comes during its start).
    const beats = new Set<number>();
    await waitFor('the lazy worker with its microvm tier', async () => {
      const nodes = (await api(cluster, adminToken, 'GET', '/v1/nodes')).body.nodes as { nodeId: string; healthy: boolean; atMs: number; tiers?: { microvm?: object } }[] | undefined;
      const n = nodes?.find((x) => x.nodeId === NODE && x.healthy && x.tiers?.microvm && x.atMs > since);
      if (n) beats.add(n.atMs);
      return beats.size >= 3;
    }, 60_000);
  };
  await startWorker();
}, 180_000);

afterAll(async () => {
  await cluster?.stop();
  await proxy?.close();
  expect(qemuPidsUnder(cluster.rootDir)).toEqual([]);
  expect(hostTraces(cluster.rootDir)).toEqual({ mounts: [], loops: [], containers: [] });
  expect(gatesUnder(cluster.rootDir)).toEqual([]);
  console.log(`microvm-lazy.test.ts: ${Date.now() - fileStartedMs} ms`);
}, 180_000);

beforeEach(() => {
  proxy.corrupt = undefined;
  proxy.link.bytesPerSecond = 0;
});

const create = async (tier: 'microvm' | 'container') => {
  const r = await api(cluster, token, 'POST', '/v1/sandboxes', { tier, image: { base: 'busybox', layers: ['vmbig'] }, resources: { memoryMiB: 256, cpuMillis: 1000 } });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  expect(r.body.node).toBe(NODE);
  return r.body.id as string;
};
const sh = async (id: string, cmd: string) => (await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs: 60_000 })).body as { exitCode: number; stdout: string; stderr: string };
const sumOf = async (id: string, i: number) => {
  const r = await sh(id, `sha256sum ${file(i)}`);
  expect(r.exitCode, r.stderr).toBe(0);
  return r.stdout.split(' ')[0];
};
const remove = (...ids: string[]) => Promise.all(ids.map((id) => api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)));

describe('lazy layers on microVMs', () => {
  let vm: string;

  it('boots a VM on a host without the layer; reading one file fetches about that file; the host cache serves a container and a second VM', async () => {
    proxy.reset();
    const started = Date.now();
    vm = await create('microvm');
    const createMs = Date.now() - started;
    const atBoot = { ...proxy.bytes };
    const readStarted = Date.now();
    expect(await sumOf(vm, 7)).toBe(sums[7]);
    const readMs = Date.now() - readStarted;
    const read = proxy.bytes.blob - atBoot.blob;
    console.log(`lazy VM: create ${createMs} ms (blob bytes at boot ${atBoot.blob}), first read of a 2 MiB file ${readMs} ms, ${read} blob bytes fetched for it`);
    // The 2 MiB file in 1 MiB chunks, one more where it straddles a boundary: never the layer.
    expect(read).toBeGreaterThanOrEqual(FILE_BYTES);
    expect(read).toBeLessThan(5 * MiB);
    expect(proxy.bytes.blob).toBeLessThan(0.25 * FILES * FILE_BYTES);
    const blob = path.join(cacheDir(), `${digest.slice(7)}.data`);
    expect(fs.statSync(blob).blocks * 512).toBeLessThan(8 * MiB);

    // The chunks are the host's: a container and another VM read them without a fetch.
    const before = proxy.bytes.blob;
    const [container, other] = await Promise.all([create('container'), create('microvm')]);
    const beforeReads = proxy.bytes.blob;
    expect(await sumOf(container, 7)).toBe(sums[7]);
    expect(await sumOf(other, 7)).toBe(sums[7]);
    expect(proxy.bytes.blob).toBe(beforeReads);
    console.log(`a container and a VM more: ${beforeReads - before} blob bytes at their start, 0 for the file`);
    // A chunk the VM reads first is there for the container at once.
    expect(await sumOf(other, 8)).toBe(sums[8]);
    const afterVm = proxy.bytes.blob;
    expect(await sumOf(container, 8)).toBe(sums[8]);
    expect(proxy.bytes.blob).toBe(afterVm);
    await remove(container, other);
  }, 180_000);

  it('keeps gating a VM\'s reads after the last container on the layer is gone (the blob is held for the VM)', async () => {
    const container = await create('container');
    expect(await sumOf(container, 9)).toBe(sums[9]);
    await remove(container);
    await sleep(600); // past the idle unmount: the layer is unmounted on the host, the VM still reads it
    expect(await sumOf(vm, 10)).toBe(sums[10]);
    expect(await sh(vm, `cmp ${file(9)} ${file(10)} >/dev/null; echo $?`)).toMatchObject({ stdout: '1\n' });
  }, 120_000);

  it('refuses a corrupted chunk by its digest: the guest reads EIO, then the file once the origin is sound', async () => {
    proxy.corruptBlobs();
    const bad = await sh(vm, `sha256sum ${file(11)}`);
    expect(bad.exitCode).not.toBe(0);
    expect(bad.stderr).toMatch(EIO_MESSAGE);
    proxy.corrupt = undefined;
    expect(await sumOf(vm, 11)).toBe(sums[11]);
  }, 60_000);

  it('keeps gating an adopted VM\'s reads after a worker restart (the gate kept the blob)', async () => {
    const exited = new Promise((resolve) => worker.once('exit', resolve));
    worker.kill('SIGTERM'); // an upgrade: sandboxes left running for the next worker
    await exited;
    await startWorker();
    const before = proxy.bytes.blob;
    expect(await sumOf(vm, 16)).toBe(sums[16]);
    expect(proxy.bytes.blob - before).toBeGreaterThanOrEqual(FILE_BYTES);
    expect(await sumOf(vm, 7)).toBe(sums[7]);
  }, 120_000);

  it('gives the guest command an I/O error when the origin stops mid-read; the VM runs on, cached files read, the rest once it is back', async () => {
    proxy.link.bytesPerSecond = 2 * MiB;
    const before = proxy.requests.blob;
    const started = Date.now();
    const reading = sh(vm, `cat ${[12, 13, 14, 15].map(file).join(' ')} > /dev/null`);
    await waitFor('the read under way', async () => proxy.requests.blob > before);
    await sleep(300);
    await proxy.stop();
    const r = await reading;
    console.log(`origin stopped mid-read: the guest's cat ended ${Date.now() - started} ms after it started: ${r.stderr.trim()}`);
    expect(r.exitCode).not.toBe(0);
    expect(r.stderr).toMatch(EIO_MESSAGE);
    // Not paused, not failed: cached files read, and the guest never saw zeros.
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${vm}`)).body.state).toBe('running');
    expect(await sumOf(vm, 7)).toBe(sums[7]);
    proxy.link.bytesPerSecond = 0;
    await proxy.start();
    for (const i of [12, 13, 14, 15]) expect(await sumOf(vm, i)).toBe(sums[i]);
    await remove(vm);
    await waitFor('no QEMU left', async () => qemuPidsUnder(cluster.rootDir).length === 0);
    expect(worker.exitCode).toBeNull();
  }, 120_000);
});
