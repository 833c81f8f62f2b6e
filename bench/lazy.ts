/**
 * bench:lazy — the seed's on-demand experiment (DSec: "on-demand loading finished in ~35 min
 * against more than 60 min for full remote pulls", disk writes -57%), small: BENCH_LAZY_IMAGES
 * (8) images of at least BENCH_LAZY_IMAGE_MB (320) MB each, built from this host's /usr files
 * (real trees: each image a different draw of its package directories, plus a few MiB of its
 * own), and BENCH_LAZY_TASKS (64) tasks, 8 at once, over two worker hosts without the layers,
 * behind a throttled origin: a proxy in front of the gateway capping the bandwidth of every
 * host together at BENCH_LAZY_MBPS (50) MB/s and adding BENCH_LAZY_DELAY_MS (5) ms per request.
 * A task reads 5-13% of its image (package directories of 512 KB and more: a share every task
 * of the image reads, its "imports", and its own), writes 3 MiB, then works for
 * BENCH_LAZY_THINK_MS (10000) ms.
 *
 * Arms, each on two fresh worker hosts: layers pre-placed (the hosts share the gateway's
 * store), full copy before start (ROLLBOX_LAYER_FETCH=full: the whole layer into the host's
 * store when a sandbox first needs it), on demand fetching only what reads ask for (no
 * readahead: `lazy-noahead`), on demand (readahead, no prefetch list), and on demand with the
 * prefetch lists the previous arm's first runs recorded. Before them, with
 * BENCH_LAZY_SWEEP=1, the chunk-size sweep: one image built with 256 KiB, 1 MiB and 4 MiB
 * chunks, 8 tasks of it on a fresh host each: bytes fetched against bytes read
 * (amplification), range requests, time (BENCH_LAZY_ONLY=sweep runs only that).
 *
 * Reported per arm: completion time of all tasks, create-to-first-command p50/p95, bytes
 * fetched per host as a fraction of the images it ran, bytes written to the hosts' disks for
 * layers (allocated bytes of their layer stores and chunk caches, and the write_bytes of the
 * worker, gate and keeper processes). Progress on stderr, a chart in bench/out/lazy.svg, one
 * JSON line last.
 */
import { execFileSync, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, statSync } from 'node:fs';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { mulberry32 } from '../src/burst/index.ts';
import { LayerStore, mkfsErofs, storeTreeAsLayer } from '../src/layers/index.ts';
import { runToolOk } from '../src/proc/index.ts';
import { CLUSTER_OWNER, LayerRegistry } from '../src/registry/index.ts';
import { barChartsSvg, percentile, progressBar, writeSvg } from '../src/report/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from '../test/support/cluster.ts';
import { OriginProxy, ThrottledLink } from '../test/support/origin-proxy.ts';
import { jsonClient } from './support/http.ts';

const env = process.env;
const IMAGES = Number(env.BENCH_LAZY_IMAGES ?? 8);
const IMAGE_BYTES = Number(env.BENCH_LAZY_IMAGE_MB ?? 320) * 1e6;
const TASKS = Number(env.BENCH_LAZY_TASKS ?? 64);
const CONCURRENCY = Number(env.BENCH_LAZY_CONCURRENCY ?? 8);
const HOSTS = 2;
const LINK_BYTES_PER_S = Number(env.BENCH_LAZY_MBPS ?? 50) * 1e6;
const DELAY_MS = Number(env.BENCH_LAZY_DELAY_MS ?? 5);
const THINK_MS = Number(env.BENCH_LAZY_THINK_MS ?? 10_000);
const WRITE_MIB = 3;
/** A layer's prefetch list records its first runs: about one task's read and work. */
const PREFETCH_WINDOW_MS = Number(env.BENCH_LAZY_PREFETCH_WINDOW_MS ?? Math.max(5000, THINK_MS + 4000));
/**
 * Share of an image every task of it reads (its "imports"), and the most a task reads of its
 * own on top; packages drawn overshoot by one package at most (SHARED_PACKAGE_MAX, OWN_PACKAGE_MAX
 * of the image): a task reads 5-13%.
 */
const SHARED_FRACTION = 0.05;
const SHARED_PACKAGE_MAX = 0.015;
const OWN_FRACTION_MAX = 0.055;
const OWN_PACKAGE_MAX = 0.01;
/**
 * Reads come in packages (a library with its data, a Python package): directories whose files
 * add up to at least this. Images hold every directory drawn, tiny ones included.
 */
const READ_PACKAGE_MIN_BYTES = Number(env.BENCH_LAZY_READ_PACKAGE_KB ?? 512) * 1000;
/** `sweep` or `arms`: run one part only (BENCH_LAZY_ARMS=preplaced,lazy: only those arms). */
const ONLY = env.BENCH_LAZY_ONLY;
/** The chunk-size sweep (BENCH_LAZY_SWEEP=1; its figures are in docs/images.md), before the arms. */
const SWEEP = env.BENCH_LAZY_SWEEP === '1';
const SWEEP_CHUNKS = [256 * 1024, 1024 * 1024, 4 * 1024 * 1024];
/** Where the images' files come from. */
const POOL_ROOTS = ['usr/lib/x86_64-linux-gnu', 'usr/lib/python3.11', 'usr/lib/python3', 'usr/share', 'usr/bin', 'usr/sbin', 'usr/include', 'usr/lib/gcc', 'usr/libexec', 'usr/lib/jvm', 'usr/lib/node_modules'];

const MB = 1e6;
const MiB = 1024 * 1024;
const round = (x: number) => Math.round(x * 100) / 100;
const log = (line: string) => process.stderr.write(`${line}\n`);

// ---------------------------------------------------------------- images from the host's files

interface Pkg {
  /** A directory (relative to /) and the regular files directly in it. */
  dir: string;
  files: { path: string; size: number }[];
  bytes: number;
}

async function hostPackages(): Promise<Pkg[]> {
  const pkgs: Pkg[] = [];
  const walk = async (rel: string): Promise<void> => {
    const entries = await fs.readdir(`/${rel}`, { withFileTypes: true }).catch(() => []);
    const files: Pkg['files'] = [];
    for (const e of entries) {
      const p = `${rel}/${e.name}`;
      if (e.isDirectory()) await walk(p);
      else if (e.isFile()) {
        const size = await fs.stat(`/${p}`).then((s) => s.size, () => 0);
        if (size > 0 && size < 64 * MiB) files.push({ path: p, size });
      }
    }
    if (files.length) pkgs.push({ dir: rel, files, bytes: files.reduce((s, f) => s + f.size, 0) });
  };
  for (const root of POOL_ROOTS) await walk(root);
  return pkgs;
}

interface ImageSpec {
  name: string;
  pkgs: Pkg[];
  bytes: number;
  /** Read by every task of the image. */
  shared: Pkg[];
  digest?: string;
}

function shuffle<T>(items: readonly T[], random: () => number): T[] {
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

/** Packages drawn until `bytes`, none over a tenth of it (reads come in packages, as imports do). */
function draw(pool: readonly Pkg[], bytes: number, random: () => number, cap = bytes / 10): Pkg[] {
  const out: Pkg[] = [];
  let sum = 0;
  for (const p of shuffle(pool, random)) {
    if (sum >= bytes) break;
    if (p.bytes > cap) continue;
    out.push(p);
    sum += p.bytes;
  }
  return out;
}

const sumBytes = (pkgs: readonly Pkg[]) => pkgs.reduce((s, p) => s + p.bytes, 0);
const readable = (pkgs: readonly Pkg[]) => pkgs.filter((p) => p.bytes >= READ_PACKAGE_MIN_BYTES);

function imageSpecs(pool: Pkg[]): ImageSpec[] {
  const specs: ImageSpec[] = [];
  for (let i = 0; i < IMAGES; i++) {
    const random = mulberry32(1000 + i);
    const pkgs = draw(pool, IMAGE_BYTES, random);
    const bytes = sumBytes(pkgs);
    specs.push({ name: `lazy-img-${i}`, pkgs, bytes, shared: draw(readable(pkgs), SHARED_FRACTION * bytes, random, SHARED_PACKAGE_MAX * bytes) });
  }
  return specs;
}

/** The image's tar: its host files (GNU tar, names sorted), then a directory of its own. */
async function imageTar(spec: ImageSpec, work: string): Promise<string> {
  const list = path.join(work, `${spec.name}.list`);
  await fs.writeFile(list, `${spec.pkgs.flatMap((p) => p.files.map((f) => f.path)).join('\n')}\n`);
  const own = path.join(work, `${spec.name}-own`);
  await fs.mkdir(path.join(own, 'opt', 'task'), { recursive: true });
  const random = mulberry32(7 + spec.name.length * 31 + Number(spec.name.slice(-1)));
  const data = Buffer.alloc(2 * MiB);
  for (let k = 0; k < data.length; k += 4) data.writeUInt32LE((random() * 2 ** 32) >>> 0, k);
  await fs.writeFile(path.join(own, 'opt', 'task', 'fixture.bin'), data);
  const tar = path.join(work, `${spec.name}.tar`);
  await runToolOk('tar', ['--sort=name', '--numeric-owner', '--no-recursion', '-cf', tar, '-C', '/', '-T', list]);
  await runToolOk('tar', ['--numeric-owner', '-rf', tar, '-C', own, 'opt', 'opt/task', 'opt/task/fixture.bin']);
  return tar;
}

/**
 * The image's tar as a layer of the gateway's store, built as the gateway builds layers
 * (storeTreeAsLayer: split, 1 MiB chunks) from the tree GNU tar extracts (a bench of reading
 * layers, not of importing them: bench:import measures that), and registered under its name.
 */
async function storeLayer(cluster: TestCluster, redis: Redis, name: string, tar: string, work: string, chunkSizeBytes?: number): Promise<{ digest: string; sizeBytes: number }> {
  const dir = await fs.mkdtemp(path.join(work, `${name}-`));
  try {
    const root = path.join(dir, 'root');
    await fs.mkdir(root);
    await runToolOk('tar', ['-xf', tar, '-C', root]);
    const store = new LayerStore(cluster.config.layerStoreDir);
    const stored = chunkSizeBytes
      ? await (async () => {
          await mkfsErofs(root, path.join(dir, 'meta'), { blob: { path: path.join(dir, 'blob'), chunkSizeBytes } });
          return store.putSplit({ metaPath: path.join(dir, 'meta'), blobPath: path.join(dir, 'blob'), chunkSizeBytes });
        })()
      : await storeTreeAsLayer(root, dir, store);
    await new LayerRegistry(redis).register({ digest: stored.digest, sizeBytes: stored.sizeBytes, name, parents: [], createdAt: new Date().toISOString() }, CLUSTER_OWNER);
    return stored;
  } finally {
    await fs.rm(dir, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------- tasks

interface Task {
  image: ImageSpec;
  layer: string;
  files: string[];
  readBytes: number;
}

function tasksFor(images: ImageSpec[], count: number, seed: number): Task[] {
  const random = mulberry32(seed);
  const tasks: Task[] = [];
  for (let k = 0; k < count; k++) {
    const image = images[k % images.length]!;
    const sharedSet = new Set(image.shared);
    const own = draw(readable(image.pkgs).filter((p) => !sharedSet.has(p)), random() * OWN_FRACTION_MAX * image.bytes, random, OWN_PACKAGE_MAX * image.bytes);
    const pkgs = [...image.shared, ...own];
    tasks.push({ image, layer: image.name, files: pkgs.flatMap((p) => p.files.map((f) => `/${f.path}`)), readBytes: sumBytes(pkgs) });
  }
  return shuffle(tasks, random);
}

interface TaskResult {
  firstCommandMs: number;
  readMs: number;
  node: string;
  error?: string;
}

async function runTask(client: ReturnType<typeof jsonClient>, task: Task, thinkMs: number): Promise<TaskResult> {
  const started = performance.now();
  const created = await client('POST', '/v1/sandboxes', { image: { base: 'busybox', layers: [task.layer] }, resources: { memoryMiB: 256, requests: { memoryMiB: 64 } }, ttlSeconds: 3600 });
  if (created.status !== 201) return { firstCommandMs: NaN, readMs: NaN, node: '', error: `create: ${created.status} ${JSON.stringify(created.body).slice(0, 300)}` };
  const id = created.body.id as string;
  try {
    const first = await client('POST', `/v1/sandboxes/${id}/exec`, { argv: ['true'] });
    const firstCommandMs = performance.now() - started;
    if (first.body.exitCode !== 0) return { firstCommandMs, readMs: NaN, node: created.body.node, error: `true: ${JSON.stringify(first.body).slice(0, 300)}` };
    const readStarted = performance.now();
    const read = await client('POST', `/v1/sandboxes/${id}/exec`, {
      cmd: `xargs -0 cat > /dev/null && dd if=/dev/urandom of=/root/out bs=1M count=${WRITE_MIB} 2> /dev/null`,
      stdin: `${task.files.join('\0')}\0`,
      timeoutMs: 600_000,
    });
    const readMs = performance.now() - readStarted;
    if (read.body.exitCode !== 0) return { firstCommandMs, readMs, node: created.body.node, error: `read: ${String(read.body.stderr).slice(0, 300)}` };
    if (thinkMs > 0) await client('POST', `/v1/sandboxes/${id}/exec`, { argv: ['sleep', String(thinkMs / 1000)], timeoutMs: thinkMs + 60_000 });
    return { firstCommandMs, readMs, node: created.body.node };
  } finally {
    await client('DELETE', `/v1/sandboxes/${id}`);
  }
}

async function runTasks(label: string, client: ReturnType<typeof jsonClient>, tasks: Task[], concurrency: number, thinkMs: number): Promise<{ results: TaskResult[]; makespanMs: number }> {
  const bar = progressBar(label, { total: tasks.length });
  const queue = [...tasks];
  const results: TaskResult[] = [];
  const started = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      for (let t = queue.shift(); t; t = queue.shift()) {
        results.push(await runTask(client, t, thinkMs));
        bar.tick();
      }
    }),
  );
  bar.done();
  const failed = results.filter((r) => r.error);
  if (failed.length) throw new Error(`${label}: ${failed.length} tasks failed, e.g. ${failed[0]!.error}`);
  return { results, makespanMs: performance.now() - started };
}

// ---------------------------------------------------------------- hosts

interface Host {
  nodeId: string;
  child: ChildProcess;
  dataDir: string;
  proxy?: OriginProxy;
}

async function startHosts(cluster: TestCluster, adminToken: string, arm: string, count: number, hostEnv: (nodeId: string, proxy: OriginProxy | undefined) => Record<string, string>, proxyOf?: () => Promise<OriginProxy>): Promise<Host[]> {
  const hosts: Host[] = [];
  for (let k = 0; k < count; k++) {
    const nodeId = `${arm}-h${k}`;
    const proxy = proxyOf ? await proxyOf() : undefined;
    const child = await cluster.spawnWorker({ nodeId, destroyOnExit: true, env: hostEnv(nodeId, proxy) });
    hosts.push({ nodeId, child, dataDir: path.join(cluster.rootDir, nodeId), proxy });
  }
  await waitFor(`${arm}: ${count} hosts heartbeating`, async () => {
    const nodes = (await api(cluster, adminToken, 'GET', '/v1/nodes')).body.nodes as { nodeId: string; ageMs: number; ready?: boolean }[] | undefined;
    return hosts.every((h) => nodes?.some((n) => n.nodeId === h.nodeId && n.ageMs < 1000 && n.ready !== false));
  }, 120_000);
  return hosts;
}

async function stopHosts(hosts: Host[]): Promise<void> {
  await Promise.all(
    hosts.map(async (h) => {
      const exited = new Promise((resolve) => h.child.once('exit', resolve));
      if (h.child.exitCode === null && h.child.signalCode === null) h.child.kill('SIGTERM');
      await exited;
      await h.proxy?.close();
    }),
  );
}

/** Allocated bytes of the files under `dir` (sparse blobs count what they hold). */
function allocatedBytes(dir: string): number {
  if (!existsSync(dir)) return 0;
  try {
    return Number(execFileSync('du', ['-s', '-B1', dir], { encoding: 'utf8' }).split('\t')[0]);
  } catch {
    return 0;
  }
}

function writeBytesOf(pid: number | undefined): number {
  if (!pid) return 0;
  try {
    return Number(/^write_bytes: (\d+)$/m.exec(readFileSync(`/proc/${pid}/io`, 'utf8'))?.[1] ?? 0);
  } catch {
    return 0;
  }
}

/** CPU seconds a process has used (user + system), its reaped children included. */
function cpuSecondsOf(pid: number | undefined): number {
  if (!pid) return 0;
  try {
    // Fields after the command's closing parenthesis: utime, stime, cutime, cstime are the 12th-15th.
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    return [11, 12, 13, 14].reduce((sum, i) => sum + Number(fields[i]), 0) / CLOCK_TICKS_PER_S;
  } catch {
    return 0;
  }
}
const CLOCK_TICKS_PER_S = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;

/** CPU seconds of a host's worker, gate and keeper processes. */
function hostCpuSeconds(h: Host): number {
  const gateDir = path.join(h.dataDir, 'worker', 'gate');
  return cpuSecondsOf(h.child.pid) + cpuSecondsOf(pidIn(path.join(gateDir, 'gate.pid'))) + cpuSecondsOf(pidIn(path.join(gateDir, 'keeper.pid')));
}

function pidIn(file: string): number | undefined {
  try {
    return Number(readFileSync(file, 'utf8').trim()) || undefined;
  } catch {
    return undefined;
  }
}

/** What landed on a host's disk for layers: its store and chunk cache, and what its worker, gate and keeper wrote. */
function hostDisk(h: Host): { layerFilesBytes: number; processWriteBytes: number } {
  const gateDir = path.join(h.dataDir, 'worker', 'gate');
  return {
    layerFilesBytes: allocatedBytes(path.join(h.dataDir, 'own-layers')) + allocatedBytes(path.join(h.dataDir, 'worker', 'lazy')),
    processWriteBytes: writeBytesOf(h.child.pid) + writeBytesOf(pidIn(path.join(gateDir, 'gate.pid'))) + writeBytesOf(pidIn(path.join(gateDir, 'keeper.pid'))),
  };
}

// ---------------------------------------------------------------- the run

interface ArmFigures {
  arm: string;
  makespanS: number;
  firstCommandP50Ms: number;
  firstCommandP95Ms: number;
  readP50Ms: number;
  readMeanMs: number;
  /** Range requests for blob chunks, all hosts. */
  rangeRequests: number;
  fetchedBytes: number;
  /** Per host: bytes fetched / bytes of the distinct images it ran. */
  fetchedFractionPerHost: number[];
  layerFilesBytes: number;
  processWriteBytes: number;
  /** CPU seconds over the arm: the hosts' worker, gate and keeper processes; this process (gateway, origin proxy, the bench's client). */
  hostCpuS: number;
  gatewayAndOriginCpuS: number;
}

const work = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-bench-lazy-'));
let cluster: TestCluster | undefined;
const cleanup = async () => {
  await cluster?.stop().catch(() => undefined);
  await fs.rm(work, { recursive: true, force: true });
};
process.once('SIGINT', () => void cleanup().finally(() => process.exit(130)));
try {
  const benchStarted = performance.now();
  // BENCH_LAZY_GZIP_LEVEL=0: chunk ranges sent as stored (the gateway's ROLLBOX_LAYER_BLOB_GZIP_LEVEL; default 1).
  cluster = await startTestCluster({ env: { ROLLBOX_CREATE_TIMEOUT_MS: '900000', ROLLBOX_NODE_LOST_AFTER_MS: '10000', ROLLBOX_LAYER_BLOB_GZIP_LEVEL: env.BENCH_LAZY_GZIP_LEVEL ?? '1' } });
  const c = cluster;
  const token = await c.token('bench', ['layer:write', 'layer:read', 'sandbox:create', 'sandbox:exec', 'sandbox:delete', 'sandbox:read'], 6 * 3600);
  const adminToken = await c.token('admin', ['admin'], 6 * 3600);
  const hostToken = await c.token('host', ['layer:read'], 6 * 3600);
  const client = jsonClient(c.url, token);

  // 1. The images, from this host's files.
  const pool = await hostPackages();
  const images = imageSpecs(pool);
  const redis = new Redis(c.redisUrl);
  const imagesBar = progressBar('images: tar + layer', { total: images.length });
  // Two at a time (two cores).
  const toBuild = [...images];
  await Promise.all(
    [0, 1].map(async () => {
      for (let spec = toBuild.shift(); spec; spec = toBuild.shift()) {
        const tar = await imageTar(spec, work);
        spec.digest = (await storeLayer(c, redis, spec.name, tar, work)).digest;
        if (!SWEEP || spec !== images[0]) await fs.rm(tar, { force: true });
        imagesBar.tick();
      }
    }),
  );
  imagesBar.done();
  const imageMB = images.map((i) => round(i.bytes / MB));
  log(`images: ${images.length} of ${Math.min(...imageMB)}-${Math.max(...imageMB)} MB of files (${images.map((i) => i.pkgs.reduce((s, p) => s + p.files.length, 0)).join(', ')} files)`);
  const link = new ThrottledLink(LINK_BYTES_PER_S);
  const newProxy = () => new OriginProxy(c.url, { link, delayMs: DELAY_MS }).start();
  const remoteEnv = (extra: Record<string, string>) => (nodeId: string, proxy: OriginProxy | undefined): Record<string, string> => ({
    ROLLBOX_LAYER_STORE: path.join(c.rootDir, nodeId, 'own-layers'),
    ROLLBOX_GATEWAY_URL: proxy!.url,
    ROLLBOX_GATEWAY_TOKEN: hostToken,
    ...extra,
  });

  // 2. The chunk-size sweep: one image, three chunk sizes, 8 tasks on a fresh host each.
  const sweep: Record<string, unknown>[] = [];
  if (SWEEP && ONLY !== 'arms') {
    const spec = images[0]!;
    const store = new LayerStore(c.config.layerStoreDir);
    const sweepTasks = tasksFor([spec], 8, 99);
    for (const chunk of SWEEP_CHUNKS) {
      const kib = chunk / 1024;
      const stored = await storeLayer(c, redis, `${spec.name}-c${kib}`, path.join(work, `${spec.name}.tar`), work, chunk);
      const hosts = await startHosts(c, adminToken, `sweep${kib}`, 1, remoteEnv({ ROLLBOX_LAZY_PREFETCH: 'off' }), newProxy);
      const { results, makespanMs } = await runTasks(`sweep: ${kib} KiB chunks`, client, sweepTasks.map((t) => ({ ...t, layer: `${spec.name}-c${kib}` })), 8, 0);
      const proxy = hosts[0]!.proxy!;
      const readUnion = new Set(sweepTasks.flatMap((t) => t.files));
      const readBytes = [...readUnion].reduce((s, f) => s + statSync(f).size, 0);
      sweep.push({
        chunkKiB: kib,
        fetchedMB: round(proxy.bytes.blob / MB),
        readMB: round(readBytes / MB),
        amplification: round(proxy.bytes.blob / readBytes),
        rangeRequests: proxy.requests.blob,
        makespanS: round(makespanMs / 1000),
        readP50Ms: round(percentile(results.map((r) => r.readMs).sort((a, b) => a - b), 50)),
        metaKiB: round((await fs.stat(store.splitPathsOf(stored.digest).metaPath)).size / 1024),
      });
      log(`sweep ${kib} KiB: ${JSON.stringify(sweep.at(-1))}`);
      await stopHosts(hosts);
    }
  }
  await redis.quit();

  // 3. The arms, each on two fresh hosts, the same tasks in the same order.
  const tasks = tasksFor(images, TASKS, 42);
  const arms: { arm: string; env: (nodeId: string, proxy: OriginProxy | undefined) => Record<string, string>; remote: boolean }[] = [
    { arm: 'preplaced', env: () => ({}), remote: false },
    { arm: 'full', env: remoteEnv({ ROLLBOX_LAYER_FETCH: 'full' }), remote: true },
    // Only the chunks reads ask for (no readahead), as before 2026-12-03: the floor the others are compared with.
    { arm: 'lazy-noahead', env: remoteEnv({ ROLLBOX_LAZY_PREFETCH: 'off', ROLLBOX_LAZY_READAHEAD_CHUNKS: '0' }), remote: true },
    // Its first runs (each host's first PREFETCH_WINDOW_MS of a layer) record the prefetch lists the next arm fills.
    { arm: 'lazy', env: remoteEnv({ ROLLBOX_LAZY_PREFETCH: 'record', ROLLBOX_LAZY_PREFETCH_WINDOW_MS: String(PREFETCH_WINDOW_MS) }), remote: true },
    { arm: 'lazy-prefetch', env: remoteEnv({ ROLLBOX_LAZY_PREFETCH: 'on' }), remote: true },
  ];
  const figures: ArmFigures[] = [];
  const only = env.BENCH_LAZY_ARMS?.split(',');
  for (const a of ONLY === 'sweep' ? [] : arms.filter((x) => !only || only.includes(x.arm))) {
    const hosts = await startHosts(c, adminToken, a.arm, HOSTS, a.env, a.remote ? newProxy : undefined);
    const cpuBefore = { hosts: hosts.reduce((x, h) => x + hostCpuSeconds(h), 0), own: process.cpuUsage() };
    const { results, makespanMs } = await runTasks(`${a.arm}: ${TASKS} tasks`, client, tasks, CONCURRENCY, THINK_MS);
    const first = results.map((r) => r.firstCommandMs).sort((x, y) => x - y);
    const reads = results.map((r) => r.readMs).sort((x, y) => x - y);
    const fractions = hosts.map((h) => {
      const ran = new Set(results.flatMap((r, i) => (r.node === h.nodeId ? [tasks[i]!.image] : [])));
      const imageBytes = [...ran].reduce((s, img) => s + img.bytes, 0);
      return h.proxy && imageBytes ? round(h.proxy.bytes.blob / imageBytes) : 0;
    });
    const disk = hosts.map(hostDisk);
    const own = process.cpuUsage(cpuBefore.own);
    figures.push({
      arm: a.arm,
      makespanS: round(makespanMs / 1000),
      firstCommandP50Ms: round(percentile(first, 50)),
      firstCommandP95Ms: round(percentile(first, 95)),
      readP50Ms: round(percentile(reads, 50)),
      readMeanMs: round(reads.reduce((x, y) => x + y, 0) / reads.length),
      rangeRequests: hosts.reduce((s, h) => s + (h.proxy?.requests.blob ?? 0), 0),
      fetchedBytes: hosts.reduce((s, h) => s + (h.proxy?.totalBytes ?? 0), 0),
      fetchedFractionPerHost: fractions,
      layerFilesBytes: disk.reduce((s, d) => s + d.layerFilesBytes, 0),
      processWriteBytes: disk.reduce((s, d) => s + d.processWriteBytes, 0),
      hostCpuS: round(hosts.reduce((x, h) => x + hostCpuSeconds(h), 0) - cpuBefore.hosts),
      gatewayAndOriginCpuS: round((own.user + own.system) / 1e6),
    });
    log(`${a.arm}: ${JSON.stringify(figures.at(-1))}`);
    await stopHosts(hosts);
    await sleep(500);
  }

  const by = (arm: string) => figures.find((f) => f.arm === arm) ?? ({ makespanS: NaN, layerFilesBytes: NaN } as ArmFigures);
  const [pre, full, lazy, lazyPre, noAhead] = [by('preplaced'), by('full'), by('lazy'), by('lazy-prefetch'), by('lazy-noahead')];
  const chart = writeSvg(
    path.resolve(import.meta.dirname, 'out', 'lazy.svg'),
    barChartsSvg(`On-demand layers: ${TASKS} tasks, ${CONCURRENCY} at once, ${HOSTS} hosts, ${IMAGES} images of ~${Math.round(IMAGE_BYTES / MB)} MB, origin ${LINK_BYTES_PER_S / MB} MB/s`, [
        { title: 'all tasks done, s', yLabel: 's', bars: figures.map((f) => ({ label: f.arm, value: f.makespanS })) },
        { title: 'create to first command, p50 ms', yLabel: 'ms', bars: figures.map((f) => ({ label: f.arm, value: f.firstCommandP50Ms })) },
        { title: 'layer bytes on the hosts\' disks, MB', yLabel: 'MB', bars: figures.map((f) => ({ label: f.arm, value: f.layerFilesBytes / MB })) },
      ]),
  );
  log(`chart: ${chart}`);
  console.log(
    JSON.stringify({
      bench: 'lazy',
      images: IMAGES,
      imageMB,
      tasks: TASKS,
      concurrency: CONCURRENCY,
      hosts: HOSTS,
      originMBps: LINK_BYTES_PER_S / MB,
      originDelayMs: DELAY_MS,
      thinkMs: THINK_MS,
      readFraction: [round(Math.min(...tasks.map((t) => t.readBytes / t.image.bytes))), round(Math.max(...tasks.map((t) => t.readBytes / t.image.bytes)))],
      arms: figures,
      sweep,
      lazyVsPreplaced: round(lazy.makespanS / pre.makespanS),
      lazyPrefetchVsPreplaced: round(lazyPre.makespanS / pre.makespanS),
      lazyNoReadaheadVsPreplaced: round(noAhead.makespanS / pre.makespanS),
      fullVsLazy: round(full.makespanS / lazy.makespanS),
      diskLazyVsFull: round(lazy.layerFilesBytes / full.layerFilesBytes),
      targets: { lazyVsPreplaced: '<= 1.15', fullVsLazy: '>= 1.5', diskLazyVsFull: '<= 0.4' },
      benchS: round((performance.now() - benchStarted) / 1000),
      note: 'MB = 1e6 bytes; makespan = first create to last delete of all tasks; fetchedFractionPerHost = blob bytes the host fetched / bytes of the distinct images it ran; layerFilesBytes = allocated bytes of the hosts\' layer stores and chunk caches at the end of the arm (processWriteBytes: write_bytes of their worker, gate and keeper processes, children included)',
      chart,
    }),
  );
} finally {
  await cleanup();
}
