import type { ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import type http from 'node:http';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { Scope } from '../src/api/index.ts';
import { PrefetchLists } from '../src/registry/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { gatesUnder, hostTraces } from './support/host.ts';
import { OriginProxy } from './support/origin-proxy.ts';
import { tarOf } from './support/tar.ts';

const MiB = 1024 * 1024;
const SCOPES: Scope[] = ['sandbox:create', 'sandbox:read', 'sandbox:delete', 'sandbox:exec', 'layer:write'];
/** The big layer: 100 files of 2 MiB of random bytes (200 MiB of file data). */
const FILES = 100;
const FILE_BYTES = 2 * MiB;
const NODE = 'lazy-a';
/** What busybox prints for EIO. */
const EIO_MESSAGE = /Input\/output error/;

let cluster: TestCluster;
let proxy: OriginProxy;
let token: string;
let adminToken: string;
let hostToken: string;
const sums: string[] = [];
let bigDigest: string;
let worker: ChildProcess | undefined;

const file = (i: number) => `/data/f${String(i).padStart(3, '0')}.bin`;
const gateDir = () => path.join(cluster.rootDir, NODE, 'worker', 'gate');
const cacheDir = () => path.join(cluster.rootDir, NODE, 'worker', 'lazy');
const pidIn = (name: string) => Number(fs.readFileSync(path.join(gateDir(), name), 'utf8').trim());
/** Running (a zombie waiting for init to reap it has exited). */
const alive = (pid: number) => {
  try {
    return !/^\d+ \(.*\) Z/.test(fs.readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
};

/** A worker host with its own data dir and its own (empty) layer store: every layer comes from the origin. */
async function startLazyWorker(env: Record<string, string> = {}, options: { destroyOnExit?: boolean } = {}): Promise<void> {
  const since = Date.now();
  worker = await cluster.spawnWorker({
    nodeId: NODE,
    ...options,
    env: {
      ROLLBOX_LAYER_STORE: path.join(cluster.rootDir, NODE, 'own-layers'),
      ROLLBOX_GATEWAY_URL: proxy.url,
      ROLLBOX_GATEWAY_TOKEN: hostToken,
      ROLLBOX_LAZY_GRACE_MS: '1500',
      // Reads are counted exactly: no chunk fetched ahead (the prefetch test turns it on).
      ROLLBOX_LAZY_PREFETCH: 'record',
      ROLLBOX_LAYER_GC_INTERVAL_MS: '300',
      ...env,
    },
  });
  // Heartbeats of this process (not the last one of the worker it replaces): the first comes
  // during its start, the next ones once started (then it stops cleanly on a signal).
  const beats = new Set<number>();
  await waitFor('the lazy worker started', async () => {
    const n = ((await api(cluster, adminToken, 'GET', '/v1/nodes')).body.nodes as { nodeId: string; healthy: boolean; atMs: number }[] | undefined)?.find((x) => x.nodeId === NODE);
    if (n?.healthy && n.atMs > since) beats.add(n.atMs);
    return beats.size >= 3;
  }, 60_000);
}

/** Stops it as an upgrade does (SIGTERM, sandboxes left running for the next start to adopt). */
async function stopLazyWorker(signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  const w = worker!;
  worker = undefined;
  if (w.exitCode !== null || w.signalCode !== null) return;
  const exited = new Promise((resolve) => w.once('exit', resolve));
  w.kill(signal);
  await exited;
}

const create = async (layers: string[] = ['big']) => {
  const r = await api(cluster, token, 'POST', '/v1/sandboxes', { image: { base: 'busybox', layers }, resources: { memoryMiB: 128 } });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  expect(r.body.node).toBe(NODE);
  return r.body.id as string;
};
const sh = async (id: string, cmd: string) => (await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs: 60_000 })).body as { exitCode: number; stdout: string; stderr: string };
const sumOf = async (id: string, i: number) => {
  const r = await sh(id, `sha256sum ${file(i)}`);
  expect(r.exitCode, JSON.stringify(r).slice(0, 500)).toBe(0);
  return r.stdout.split(' ')[0];
};

beforeEach(() => {
  // Whatever a failed test left: an origin that is up, sound and unthrottled.
  proxy.corrupt = undefined;
  proxy.answer = undefined;
  proxy.link.bytesPerSecond = 0;
});

beforeAll(async () => {
  // Heartbeats may stop for a few seconds (a killed worker) before the host counts as lost.
  cluster = await startTestCluster({ env: { ROLLBOX_NODE_LOST_AFTER_MS: '15000', ROLLBOX_LAYER_GC_GRACE_MS: '500', ROLLBOX_LAYER_GC_INTERVAL_MS: '300', ROLLBOX_NODE_IDLE_UNMOUNT_MS: '200' } });
  token = await cluster.token('lazy', SCOPES);
  hostToken = await cluster.token('host', ['layer:host']);
  adminToken = await cluster.token('admin', ['admin']);
  proxy = await new OriginProxy(cluster.url).start();
  const entries = [{ name: 'data/', type: 'directory' as const, mode: 0o755 }];
  const tarFiles: { name: string; content: Buffer }[] = [];
  for (let i = 0; i < FILES; i++) {
    const content = randomBytes(FILE_BYTES);
    sums.push(createHash('sha256').update(content).digest('hex'));
    tarFiles.push({ name: file(i).slice(1), content });
  }
  const tar = await tarOf([...entries, ...tarFiles.map((f) => ({ name: f.name, content: f.content as unknown as string }))]);
  const uploaded = await api(cluster, token, 'POST', '/v1/layers?name=big', new Uint8Array(tar), { 'content-type': 'application/x-tar' });
  expect(uploaded.status, JSON.stringify(uploaded.body)).toBe(201);
  bigDigest = uploaded.body.digest;
  await startLazyWorker();
}, 180_000);

afterAll(async () => {
  await cluster?.stop();
  await proxy?.close();
  expect(hostTraces(cluster.rootDir)).toEqual({ mounts: [], loops: [], containers: [] });
  expect(gatesUnder(cluster.rootDir)).toEqual([]);
}, 180_000);

describe('lazy layers on a host without the layer store', () => {
  it('reads one file of a 200 MiB layer fetching a few MiB; a second sandbox and a worker restart fetch nothing more', async () => {
    proxy.reset();
    const a = await create();
    expect(await sumOf(a, 42)).toBe(sums[42]);
    const first = { ...proxy.bytes };
    // The 2 MiB file in 1 MiB chunks (plus one for a file that straddles a chunk boundary), and busybox's.
    expect(first.blob).toBeGreaterThanOrEqual(FILE_BYTES);
    expect(first.blob).toBeLessThan(8 * MiB);
    expect(first.meta + first.chunks).toBeLessThan(1 * MiB);
    expect(proxy.totalBytes).toBeLessThan(0.05 * FILES * FILE_BYTES);

    const b = await create();
    expect(await sumOf(b, 42)).toBe(sums[42]);
    expect(proxy.bytes).toEqual(first);

    await stopLazyWorker();
    await startLazyWorker();
    for (const id of [a, b]) expect(await sumOf(id, 42)).toBe(sums[42]);
    const c = await create();
    expect(await sumOf(c, 42)).toBe(sums[42]);
    expect(proxy.bytes).toEqual(first);
    // What the host holds: the chunks read, in its sparse cache.
    const blob = path.join(cacheDir(), `${bigDigest.slice(7)}.data`);
    expect(fs.statSync(blob).size).toBeGreaterThanOrEqual(FILES * FILE_BYTES);
    expect(fs.statSync(blob).blocks * 512).toBeLessThan(8 * MiB);
    for (const id of [a, b, c]) await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
  });

  it('refuses a corrupted chunk from the origin by its digest (EIO), then reads it right once the origin is sound', async () => {
    const id = await create();
    proxy.corruptBlobs();
    const bad = await sh(id, `sha256sum ${file(7)}`);
    expect(bad.exitCode).not.toBe(0);
    expect(bad.stderr).toMatch(EIO_MESSAGE);
    proxy.corrupt = undefined;
    expect(await sumOf(id, 7)).toBe(sums[7]);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
  });

  it('fails a read with EIO when the origin stops mid-read; files already cached still read', async () => {
    const id = await create();
    expect(await sumOf(id, 8)).toBe(sums[8]);
    proxy.link.bytesPerSecond = 4 * MiB;
    const before = proxy.requests.blob;
    const reading = sh(id, `cat ${[10, 11, 12, 13].map(file).join(' ')} > /dev/null`);
    await waitFor('the read under way', async () => proxy.requests.blob > before);
    await sleep(300);
    await proxy.stop();
    const r = await reading;
    expect(r.exitCode).not.toBe(0);
    expect(r.stderr).toMatch(EIO_MESSAGE);
    expect(await sumOf(id, 8)).toBe(sums[8]);
    expect(await sumOf(id, 42)).toBe(sums[42]);
    proxy.link.bytesPerSecond = 0;
    await proxy.start();
    expect(await sumOf(id, 10)).toBe(sums[10]);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
  });

  it('gets a read EIO or right bytes, never a wrong one, from an origin that trickles, answers too much or answers huge errors; the host stays healthy, its memory bounded', async () => {
    await stopLazyWorker();
    await startLazyWorker({ ROLLBOX_LAZY_FETCH_TIMEOUT_MS: '3000' });
    let id: string | undefined;
    try {
      id = await create();
      // sha256sum (busybox, lazy too) read once while the origin is sound.
      expect(await sumOf(id, 49)).toBe(sums[49]);
      const pid = worker!.pid!;
      const peakKiB = () => Number(/VmHWM:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))![1]);
      const peakBefore = peakKiB();
      const rangeOf = (req: http.IncomingMessage) => (/bytes=(\d+)-(\d+)/.exec(req.headers.range ?? '') ?? []).slice(1).map(Number) as [number, number];
      const piece = Buffer.alloc(MiB, 0x5a);
      /** Sends `total` bytes of `piece`, as fast as the client takes them, until it goes. */
      const flood = (res: http.ServerResponse, total: number) => {
        let sent = 0;
        const pump = () => {
          while (sent < total) {
            sent += piece.length;
            if (!res.write(piece)) return void res.once('drain', pump);
          }
          res.end();
        };
        res.once('close', () => void (sent = total));
        pump();
      };
      const readOf = async (i: number) => {
        const startedMs = Date.now();
        const r = await sh(id!, `sha256sum ${file(i)}`);
        return { ...r, ms: Date.now() - startedMs };
      };
      const cases: [string, number, NonNullable<OriginProxy['answer']>][] = [
        [
          'a byte every 200 ms',
          50,
          (kind, req, res) => {
            if (kind !== 'blob') return false;
            const [a, b] = rangeOf(req);
            res.writeHead(206, { 'content-length': b - a + 1, 'content-range': `bytes ${a}-${b}/*` });
            const timer = setInterval(() => res.write(Buffer.from([0x5a])), 200);
            res.once('close', () => clearInterval(timer));
            return true;
          },
        ],
        ['a 256 MiB error body', 51, (kind, _req, res) => kind === 'blob' && (res.writeHead(500, { 'content-type': 'text/plain' }), flood(res, 256 * MiB), true)],
        ['the whole of a 256 MiB body for a range', 52, (kind, _req, res) => kind === 'blob' && (res.writeHead(200, { 'content-length': 256 * MiB }), flood(res, 256 * MiB), true)],
        ['64 MiB past the range asked', 53, (kind, req, res) => {
          if (kind !== 'blob') return false;
          const [a, b] = rangeOf(req);
          res.writeHead(206, { 'content-range': `bytes ${a}-${b}/*` }); // no length: chunked, as long as it goes on
          flood(res, 64 * MiB);
          return true;
        }],
      ];
      for (const [what, i, answer] of cases) {
        proxy.answer = answer;
        const r = await readOf(i);
        // EIO, or (bytes the table vouches for, then more) the right bytes: never wrong ones.
        if (r.exitCode === 0) expect(r.stdout.split(' ')[0], what).toBe(sums[i]);
        else expect(r.stderr, what).toMatch(EIO_MESSAGE);
        expect(r.ms, what).toBeLessThan(20_000);
      }
      // Nothing of those answers was held: the worker's peak memory barely moved.
      expect(peakKiB() - peakBefore).toBeLessThan(64 * 1024);
      proxy.answer = undefined;
      for (const [, i] of cases) expect(await sumOf(id!, i)).toBe(sums[i]);
      const node = ((await api(cluster, adminToken, 'GET', '/v1/nodes')).body.nodes as { nodeId: string; healthy: boolean }[]).find((n) => n.nodeId === NODE);
      expect(node?.healthy).toBe(true);
    } finally {
      proxy.answer = undefined;
      if (id) await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
      await stopLazyWorker();
      await startLazyWorker();
    }
  }, 180_000);

  it('never reads zeros when the fetcher (the worker) is killed mid-read: the read errors after the grace, and reads work again after the restart', async () => {
    const id = await create();
    proxy.link.bytesPerSecond = 2 * MiB;
    const files = [20, 21, 22, 23];
    // In the background, so the command outlives the worker: its result lands in the sandbox.
    await sh(id, `setsid sh -c 'sha256sum ${files.map(file).join(' ')} > /tmp/sums 2> /tmp/err; echo $? > /tmp/rc' < /dev/null > /dev/null 2>&1 &`);
    const before = proxy.requests.blob;
    await waitFor('the read under way', async () => proxy.requests.blob > before);
    await sleep(200);
    await stopLazyWorker('SIGKILL');
    proxy.link.bytesPerSecond = 0;
    await sleep(3000); // past the gate's 1.5 s grace
    await startLazyWorker();
    const rc = await sh(id, 'cat /tmp/rc; cat /tmp/sums; cat /tmp/err');
    const [code, ...lines] = rc.stdout.trim().split('\n');
    expect(code).not.toBe('0');
    expect(rc.stdout).toMatch(EIO_MESSAGE);
    // Whatever it did read is right: no zeros, no wrong byte.
    const zeroSum = createHash('sha256').update(Buffer.alloc(FILE_BYTES)).digest('hex');
    for (const line of lines.filter((l) => /^[0-9a-f]{64} /.test(l))) {
      const [sum, name] = line.split(/\s+/);
      expect(sum).not.toBe(zeroSum);
      expect(sum).toBe(sums[files.find((i) => file(i) === name)!]);
    }
    for (const i of files) expect(await sumOf(id, i)).toBe(sums[i]);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
  });

  it('survives the gate being killed mid-read: the read in flight errors or reads right, later reads are served by the next gate', async () => {
    const id = await create();
    const gatePid = pidIn('gate.pid');
    const keeperPid = pidIn('keeper.pid');
    proxy.link.bytesPerSecond = 2 * MiB;
    const before = proxy.requests.blob;
    const reading = sh(id, `sha256sum ${[30, 31, 32].map(file).join(' ')}`);
    await waitFor('the read under way', async () => proxy.requests.blob > before);
    await sleep(200);
    process.kill(gatePid, 'SIGKILL');
    const r = await reading;
    proxy.link.bytesPerSecond = 0;
    // The read that waited on the dead gate got EIO from the next one, or (a readahead the kernel
    // retried as a plain read) was served by it: either way, nothing read is wrong.
    if (r.stderr) expect(r.stderr).toMatch(EIO_MESSAGE);
    const zeroSum = createHash('sha256').update(Buffer.alloc(FILE_BYTES)).digest('hex');
    expect(r.stdout).not.toContain(zeroSum);
    for (const line of r.stdout.trim().split('\n').filter(Boolean)) {
      const [sum, name] = line.split(/\s+/);
      expect(sum).toBe(sums[[30, 31, 32].find((i) => file(i) === name)!]);
    }
    await waitFor('a new gate', async () => fs.existsSync(path.join(gateDir(), 'gate.pid')) && pidIn('gate.pid') !== gatePid && alive(pidIn('gate.pid')));
    expect(pidIn('keeper.pid')).toBe(keeperPid); // the same group, taken over from the keeper
    for (const i of [30, 31, 32]) expect(await sumOf(id, i)).toBe(sums[i]);
    const state = (await api(cluster, token, 'GET', `/v1/sandboxes/${id}`)).body;
    expect(state.state).toBe('running');
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
  });

  it('fails sandboxes on an incomplete lazy layer with layer_lost when the gate dies together with its keeper', async () => {
    const id = await create();
    expect(await sumOf(id, 40)).toBe(sums[40]);
    await sleep(500); // the gate syncs what it wrote and records it in the map every 200 ms
    const [gatePid, keeperPid] = [pidIn('gate.pid'), pidIn('keeper.pid')];
    // Both at once (stopped first, so neither can bring the other back).
    for (const pid of [gatePid, keeperPid]) process.kill(pid, 'SIGSTOP');
    for (const pid of [gatePid, keeperPid]) process.kill(pid, 'SIGKILL');
    const failed = await waitFor('the sandbox failed', async () => {
      const s = (await api(cluster, token, 'GET', `/v1/sandboxes/${id}`)).body;
      return s.state === 'failed' && s;
    });
    expect(failed.failureReason).toBe('layer_lost');
    // A new sandbox mounts the layer afresh, guarded by the new gate; what was cached stays.
    proxy.reset();
    const next = await create();
    expect(await sumOf(next, 40)).toBe(sums[40]);
    expect(proxy.bytes.blob).toBe(0);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${next}`);
  });

  it('removes the cache files of a deleted layer, and ends the gate when the worker stops', async () => {
    const small = await tarOf([{ name: 'small/x.txt', content: 'small layer\n' }]);
    const up = await api(cluster, token, 'POST', '/v1/layers?name=small', new Uint8Array(small), { 'content-type': 'application/x-tar' });
    expect(up.status).toBe(201);
    const id = await create(['small']);
    expect((await sh(id, 'cat /small/x.txt')).stdout).toBe('small layer\n');
    const hex = up.body.digest.slice(7);
    expect(fs.readdirSync(cacheDir()).filter((n) => n.startsWith(hex)).sort()).toEqual([`${hex}.chunks`, `${hex}.data`, `${hex}.map`, `${hex}.meta`]);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
    expect((await api(cluster, token, 'DELETE', '/v1/layers/small')).status).toBe(200);
    await waitFor('the layer collected at the gateway', async () => (await api(cluster, token, 'GET', `/v1/layers/${up.body.digest}`)).status === 404, 30_000);
    await waitFor("the layer's cache files removed on the lazy host", async () => !fs.readdirSync(cacheDir()).some((n) => n.startsWith(hex)), 30_000);

    const [gatePid, keeperPid] = [pidIn('gate.pid'), pidIn('keeper.pid')];
    await stopLazyWorker();
    expect(alive(gatePid)).toBe(true); // an upgrade: the gate waits for the next worker
    // A destroying stop: nothing mounted is left, and the gate ends with its keeper.
    await startLazyWorker({}, { destroyOnExit: true });
    expect(pidIn('gate.pid')).toBe(gatePid);
    await stopLazyWorker();
    await waitFor('the gate and its keeper gone', async () => !alive(gatePid) && !alive(keeperPid)).catch((err: unknown) => {
      throw new Error(`${String(err)}; gate.log:\n${fs.readFileSync(path.join(gateDir(), 'gate.log'), 'utf8').slice(-3000)}`);
    });
    expect(fs.readdirSync(gateDir()).filter((n) => n.endsWith('.sock') || n.endsWith('.pid'))).toEqual([]);
    expect(hostTraces(path.join(cluster.rootDir, NODE))).toEqual({ mounts: [], loops: [], containers: [] });
  });

  it("fills a layer's prefetch list (the chunks its first runs read) in the background on another host", async () => {
    const other = 'lazy-b';
    const redis = new Redis(cluster.redisUrl);
    // lazy-a's first run of the layer (the only one recorded): its list is what that run read.
    const listed = (await new PrefetchLists(redis).chunks(bigDigest).finally(() => redis.quit())).length;
    // At least the 2 MiB file's two chunks (later tests' reads ran in later worker processes: no first run).
    expect(listed).toBeGreaterThanOrEqual(FILE_BYTES / MiB);
    worker = await cluster.spawnWorker({
      nodeId: other,
      destroyOnExit: true,
      env: { ROLLBOX_LAYER_STORE: path.join(cluster.rootDir, other, 'own-layers'), ROLLBOX_GATEWAY_URL: proxy.url, ROLLBOX_GATEWAY_TOKEN: hostToken, ROLLBOX_LAZY_PREFETCH: 'on' },
    });
    await waitFor('the second lazy worker heartbeating', async () => (await api(cluster, adminToken, 'GET', '/v1/nodes')).body.nodes?.some((n: { nodeId: string; atMs: number }) => n.nodeId === other && n.atMs > 0), 60_000);
    proxy.reset();
    const r = await api(cluster, token, 'POST', '/v1/sandboxes', { image: { base: 'busybox', layers: ['big'] }, resources: { memoryMiB: 128 } });
    expect([r.status, r.body.node], JSON.stringify(r.body).slice(0, 500)).toEqual([201, other]);
    // What lazy-a's sandboxes read (f042 among it) arrives without any sandbox reading it here.
    const map = path.join(cluster.rootDir, other, 'worker', 'lazy', `${bigDigest.slice(7)}.map`);
    const filled = () => (fs.existsSync(map) ? fs.readFileSync(map).filter((b) => b === 1).length : 0);
    await waitFor('the prefetch list filled', async () => filled() >= listed, 60_000);
    const before = proxy.bytes.blob;
    expect(await sumOf(r.body.id, 42)).toBe(sums[42]);
    expect(proxy.bytes.blob).toBe(before);
    // Only the list came ahead, not the layer.
    expect(proxy.bytes.blob).toBeLessThan(0.5 * FILES * FILE_BYTES);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${r.body.id}`);
    await stopLazyWorker();
  });
});
