/**
 * bench:import — `POST /v1/images` of a multi-layer image (an OCI image layout with gzip
 * layers, ~300 MB uncompressed, BENCH_IMPORT_MB) next to the floor of the same run: the
 * same layer contents extracted with `tar -xf` and turned into EROFS by `mkfs.erofs` with
 * rollbox's flags. Then a second image on the same base layer: its import time and the
 * layers it reused, and the bytes the layer store holds for both images next to what the
 * same two images take uploaded flattened (one layer each, `POST /v1/layers`). Last, the
 * same for a real image pair made of this host's own Debian files (BENCH_IMPORT_REAL=0 skips
 * it): a base of its binaries and libraries, with Python's standard library on one and this
 * repository's node_modules on the other; Python and Node then run in sandboxes of them.
 * The pull arm (bench/support/pull-arm.ts, alone as `npm run bench:pull`; BENCH_IMPORT_PULL=0
 * skips it): an image of this host's files (over 1 GB in four layers), gzip and zstd, pulled
 * from a loopback registry against `skopeo copy` plus decompressing its blobs, same run.
 *
 * The image is generated here, deterministically (seeded), and streamed to disk: a base
 * layer (~60% of the bytes, a few thousand files of 1 KB to 4 MB of text, JSON and some
 * binary-like data in nested directories) and three upper layers (~40%: new files, base
 * files rewritten, a whiteout of a base file, an opaque directory). The second image: the
 * same base plus two other upper layers (~10%).
 *
 * BENCH_IMPORT_DRY=1: generate the archives and run the floor only (no cluster), then print
 * sizes and times; BENCH_IMPORT_KEEP=1 leaves the generated files in place. Progress on stderr, a chart in bench/out/import.svg, one JSON line last.
 */
import { createReadStream } from 'node:fs';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { Readable } from 'node:stream';
import type { Image, ImportedImage, Layer } from '../src/api/index.ts';
import { mulberry32 } from '../src/burst/index.ts';
import { tap } from '../src/layers/index.ts';
import { runToolOk } from '../src/proc/index.ts';
import { barChartsSvg, progressBar, writeSvg } from '../src/report/index.ts';
import { api, startTestCluster, type TestCluster } from '../test/support/cluster.ts';
import { MEDIA_TYPES, type ImageDef } from '../test/support/oci.ts';
import { gzipFile, hostTar, writeOciArchive, writeTar, type LayerBlobs } from './support/oci-archive.ts';
import { pullArms, pullChart } from './support/pull-arm.ts';
import { timed } from './support/runc-floor.ts';

const TOTAL_BYTES = Number(process.env.BENCH_IMPORT_MB ?? 300) * 1e6;
const DRY = process.env.BENCH_IMPORT_DRY === '1';
/** Leave the generated archives and tars in place (their directory is printed). */
const KEEP = process.env.BENCH_IMPORT_KEEP === '1';
const FLOOR_RUNS = Number(process.env.BENCH_FLOOR_RUNS ?? 3);
const GZIP_LEVEL = Number(process.env.BENCH_IMPORT_GZIP_LEVEL ?? 6);
const IMAGE_CONFIG: ImageDef['config'] = { Env: ['PATH=/usr/local/bin:/usr/bin:/bin', 'APP_HOME=/opt/app'], WorkingDir: '/opt/app', Entrypoint: ['/usr/bin/env'], Cmd: ['sh'] };

const MB = 1e6;
const MiB = 1024 * 1024;
const round = (x: number) => Math.round(x * 100) / 100;
const log = (line: string) => process.stderr.write(`${line}\n`);

// ---------------------------------------------------------------- the generated image

interface FileSpec {
  path: string;
  size: number;
  /** Content comes from this seed, so a file is written again (the flattened tars) without being kept. */
  seed: number;
  binary: boolean;
  exec: boolean;
}

interface LayerSpec {
  name: string;
  dirs: Set<string>;
  files: FileSpec[];
  /** Paths this layer deletes from the layers below (written as `.wh.<name>`). */
  whiteouts: string[];
  /** Directories whose lower contents this layer hides (written as `<dir>/.wh..wh..opq`). */
  opaques: string[];
}

interface RootSpec {
  dir: string;
  exts: string[];
  /** Chance that a file is binary-like (half its bytes incompressible). */
  binary: number;
  exec?: boolean;
}

const rng = mulberry32;

const WORDS = (() => {
  const r = rng(1);
  const letters = 'etaoinshrdlcumwfgypbvkjxqz';
  return Array.from({ length: 4000 }, () => {
    let w = '';
    const n = 2 + Math.floor(r() * r() * 11);
    for (let i = 0; i < n; i++) w += letters[Math.floor(r() * r() * letters.length)];
    return w;
  });
})();
/** A word, the frequent ones far more often (roughly Zipf-like). */
const word = (r: () => number) => WORDS[Math.floor(r() * r() * WORDS.length)]!;

/** 4 MiB of text (JSON lines, prose, code) the files' contents are cut from: compresses like text does. */
const TEXT = (() => {
  const r = rng(2);
  const parts: string[] = [];
  let n = 0;
  while (n < 4 * MiB) {
    const kind = r();
    const line =
      kind < 0.4
        ? `${JSON.stringify({ id: Math.floor(r() * 1e6), name: `${word(r)} ${word(r)}`, tags: [word(r), word(r)], score: Math.round(r() * 1e4) / 1e4, active: r() < 0.5 })}\n`
        : kind < 0.75
          ? `${Array.from({ length: 6 + Math.floor(r() * 14) }, () => word(r)).join(' ')}.\n`
          : `def ${word(r)}_${word(r)}(${word(r)}, ${word(r)}):\n    return ${word(r)} + ${Math.floor(r() * 1000)}\n\n`;
    parts.push(line);
    n += line.length;
  }
  return Buffer.from(parts.join('')).subarray(0, 4 * MiB);
})();

/** 1 MiB of incompressible bytes for the binary-like files. */
const NOISE = (() => {
  const r = rng(3);
  const b = Buffer.alloc(MiB);
  for (let i = 0; i < b.length; i += 4) b.writeUInt32LE(Math.floor(r() * 4294967296), i);
  return b;
})();

/** A file's bytes: slices of the text (and, binary-like, of the noise) picked by its seed. */
function fileContent(f: FileSpec): Buffer {
  const out = Buffer.allocUnsafe(f.size);
  const r = rng(f.seed);
  for (let at = 0; at < f.size; ) {
    const len = Math.min(f.size - at, 256 + Math.floor(r() * 3840));
    const src = f.binary && r() < 0.5 ? NOISE : TEXT;
    const from = Math.floor(r() * (src.length - len));
    src.copy(out, at, from, from + len);
    at += len;
  }
  return out;
}

/** Mostly small files, some medium, a few large: 1 KB to 4 MB, a mean near 70 KB. */
function fileSize(r: () => number): number {
  const u = r();
  const [lo, hi] = u < 0.75 ? [1e3, 16e3] : u < 0.97 ? [16e3, 256e3] : [256e3, 4e6];
  return Math.round(lo * (hi / lo) ** r());
}

function newLayer(name: string): LayerSpec {
  return { name, dirs: new Set(), files: [], whiteouts: [], opaques: [] };
}

function addParents(layer: LayerSpec, p: string): void {
  for (let i = p.indexOf('/'); i !== -1; i = p.indexOf('/', i + 1)) layer.dirs.add(p.slice(0, i));
}

function addFile(layer: LayerSpec, f: FileSpec): void {
  addParents(layer, f.path);
  layer.files.push(f);
}

/** New files under the roots until the layer holds `bytes` of file contents. */
function fill(layer: LayerSpec, roots: RootSpec[], bytes: number, r: () => number): void {
  let have = layer.files.reduce((s, f) => s + f.size, 0);
  let packageDir = '';
  let root = roots[0]!;
  for (let i = 0; have < bytes; i++) {
    // A "package" directory every 12 files, some of its files in a subdirectory.
    if (i % 12 === 0) {
      root = roots[Math.floor(r() * roots.length)]!;
      packageDir = `${root.dir}/${word(r)}-${word(r)}${i}`;
    }
    const sub = r() < 0.3 ? `/${word(r)}` : '';
    const ext = root.exts[Math.floor(r() * root.exts.length)]!;
    const size = Math.min(fileSize(r), Math.max(1000, Math.ceil(bytes - have)));
    addFile(layer, { path: `${packageDir}${sub}/${word(r)}_${i}${ext}`, size, seed: Math.floor(r() * 2 ** 31), binary: r() < root.binary, exec: root.exec ?? false });
    have += size;
  }
}

/** Image A: four layers; image B: A's base and two other upper layers. */
function generateImages(total: number): { a: LayerSpec[]; b: LayerSpec[] } {
  const r = rng(42);
  const base = newLayer('base');
  fill(
    base,
    [
      { dir: 'usr/lib/x86_64-linux-gnu', exts: ['.so', '.so.1', '.a'], binary: 0.8 },
      { dir: 'usr/lib/python3.12', exts: ['.py', '.py', '.pyi', '.json'], binary: 0.05 },
      { dir: 'usr/share/doc', exts: ['.md', '.txt', '.html', ''], binary: 0 },
      { dir: 'usr/share/locale', exts: ['.mo'], binary: 0.5 },
      { dir: 'usr/bin', exts: [''], binary: 0.9, exec: true },
      { dir: 'etc', exts: ['.conf', '.d', ''], binary: 0 },
    ],
    0.6 * total,
    r,
  );
  const taken = new Set<string>();
  const pick = (layer: LayerSpec) => {
    const free = layer.files.filter((f) => !taken.has(f.path));
    if (free.length === 0) throw new Error('BENCH_IMPORT_MB is too small for the layers this bench builds');
    const f = free[Math.floor(r() * free.length)]!;
    taken.add(f.path);
    return f;
  };

  const a1 = newLayer('a-1');
  // Rewritten base files (an upgrade), one base file deleted.
  for (let i = 0; i < Math.min(40, Math.floor(base.files.length / 4)); i++) {
    const old = pick(base);
    addFile(a1, { ...old, size: fileSize(r), seed: Math.floor(r() * 2 ** 31) });
  }
  const deleted = pick(base).path;
  a1.whiteouts.push(deleted);
  addParents(a1, deleted);
  fill(a1, [{ dir: 'opt/app/node_modules', exts: ['.js', '.js', '.json', '.d.ts', '.map'], binary: 0.02 }], 0.2 * total, r);

  const a2 = newLayer('a-2');
  // A base directory replaced wholesale (opaque), then app data.
  const dirsTaken = new Set([...taken].map((p) => path.posix.dirname(p)));
  const untouched = base.files.filter((f) => !dirsTaken.has(path.posix.dirname(f.path)));
  const opaque = path.posix.dirname((untouched.find((f) => f.path.startsWith('usr/share/doc/')) ?? untouched[0] ?? pick(base)).path);
  for (const f of base.files) if (f.path.startsWith(`${opaque}/`)) taken.add(f.path);
  a2.opaques.push(opaque);
  a2.dirs.add(opaque);
  addParents(a2, `${opaque}/x`);
  for (let i = 0; i < 5; i++) addFile(a2, { path: `${opaque}/replaced_${i}.md`, size: fileSize(r), seed: Math.floor(r() * 2 ** 31), binary: false, exec: false });
  fill(a2, [{ dir: 'opt/app/data', exts: ['.json', '.csv', '.parquet'], binary: 0.3 }], 0.12 * total, r);

  const a3 = newLayer('a-3');
  fill(
    a3,
    [
      { dir: 'opt/app/src', exts: ['.py', '.ts', '.json'], binary: 0 },
      { dir: 'root/.cache/pip', exts: ['.whl', '.json'], binary: 0.7 },
    ],
    0.08 * total,
    r,
  );

  const b1 = newLayer('b-1');
  const deletedB = pick(base).path;
  b1.whiteouts.push(deletedB);
  addParents(b1, deletedB);
  fill(b1, [{ dir: 'srv/model', exts: ['.bin', '.json', '.txt'], binary: 0.6 }], 0.07 * total, r);
  const b2 = newLayer('b-2');
  fill(b2, [{ dir: 'srv/app', exts: ['.py', '.yaml', '.txt'], binary: 0 }], 0.03 * total, r);
  return { a: [base, a1, a2, a3], b: [base, b1, b2] };
}

/** All files of the layers merged, whiteouts and opaque directories applied: what one flattened layer holds. */
function flatten(name: string, layers: LayerSpec[]): LayerSpec {
  const files = new Map<string, FileSpec>();
  const dirs = new Set<string>();
  const drop = (gone: (p: string) => boolean) => {
    for (const p of [...files.keys()]) if (gone(p)) files.delete(p);
    for (const d of [...dirs]) if (gone(d)) dirs.delete(d);
  };
  for (const l of layers) {
    for (const o of l.opaques) drop((p) => p.startsWith(`${o}/`));
    for (const w of l.whiteouts) drop((p) => p === w || p.startsWith(`${w}/`));
    for (const d of l.dirs) dirs.add(d);
    for (const f of l.files) files.set(f.path, f);
  }
  return { name, dirs, files: [...files.values()], whiteouts: [], opaques: [] };
}

const contentBytes = (l: LayerSpec) => l.files.reduce((s, f) => s + f.size, 0);

// ---------------------------------------------------------------- tar files on disk

/** A layer tar: its directories, whiteouts and opaque markers, then its files. */
async function writeLayerTar(layer: LayerSpec, file: string, onBytes: (n: number) => void): Promise<{ diffId: string; tarBytes: number }> {
  const { digest, bytes } = await writeTar(file, async (add) => {
    for (const d of [...layer.dirs].sort()) await add({ name: `${d}/`, type: 'directory', mode: 0o755 });
    for (const o of layer.opaques) await add({ name: `${o}/.wh..wh..opq` });
    for (const w of layer.whiteouts) await add({ name: path.posix.join(path.posix.dirname(w), `.wh.${path.posix.basename(w)}`) });
    for (const f of layer.files) {
      await add({ name: f.path, mode: f.exec ? 0o755 : 0o644 }, fileContent(f));
      onBytes(f.size);
    }
  });
  return { diffId: digest, tarBytes: bytes };
}

interface BuiltLayer extends LayerBlobs {
  spec: LayerSpec;
}

// ---------------------------------------------------------------- a real image pair

/**
 * Two images of this host's own Debian files on one base (its /etc, binaries and shared
 * libraries, less LLVM and static archives): A adds Python's standard library, B this
 * repository's node_modules under /opt/app. Real files (ELF binaries, .py, .js), real sizes.
 */
const REAL_BASE = ['etc', 'bin', 'sbin', 'lib', 'lib64', 'usr/bin', 'usr/sbin', 'usr/lib64', 'usr/lib/x86_64-linux-gnu'];
const REAL_BASE_EXCLUDES = ['--exclude=usr/lib/x86_64-linux-gnu/libLLVM*', '--exclude=*.a', '--exclude=usr/lib/x86_64-linux-gnu/valgrind', '--exclude=usr/lib/x86_64-linux-gnu/dri'];
const REPO = path.resolve(import.meta.dirname, '..');

async function realPair(cluster: TestCluster, token: string, work: string): Promise<Record<string, unknown>> {
  const bar = progressBar('real pair: tar + gzip of host files', { total: 5 });
  const base = await hostTar(path.join(work, 'real-base.tar'), ['-C', '/', ...REAL_BASE_EXCLUDES, ...REAL_BASE], GZIP_LEVEL);
  bar.tick();
  const python = await hostTar(path.join(work, 'real-python.tar'), ['-C', '/', 'usr/lib/python3.11', 'usr/lib/python3'], GZIP_LEVEL);
  bar.tick();
  const node = await hostTar(path.join(work, 'real-node.tar'), ['-C', REPO, '--transform=s,^node_modules,opt/app/node_modules,', 'node_modules'], GZIP_LEVEL);
  bar.tick();
  const flatA = path.join(work, 'real-flat-a.tar');
  const flatB = path.join(work, 'real-flat-b.tar');
  await runToolOk('tar', ['--sort=name', '--numeric-owner', '-cf', flatA, '-C', '/', ...REAL_BASE_EXCLUDES, ...REAL_BASE, 'usr/lib/python3.11', 'usr/lib/python3']);
  bar.tick();
  await runToolOk('tar', ['--sort=name', '--numeric-owner', '-cf', flatB, '-C', '/', ...REAL_BASE_EXCLUDES, ...REAL_BASE, '-C', REPO, '--transform=s,^node_modules,opt/app/node_modules,', 'node_modules']);
  bar.done();
  const config = { Env: ['PATH=/usr/local/bin:/usr/bin:/bin'], WorkingDir: '/opt/app' };
  const archiveA = path.join(work, 'real-a.tar');
  const archiveB = path.join(work, 'real-b.tar');
  await writeOciArchive(archiveA, [base, python], 'real-python:1', config);
  await writeOciArchive(archiveB, [base, node], 'real-node:1', config);

  const a = await upload<ImportedImage>(cluster, token, '/v1/images?name=real-python', archiveA, 'import real A (base + python)');
  const b = await upload<ImportedImage>(cluster, token, '/v1/images?name=real-node', archiveB, 'import real B (base + node_modules)');
  const flatUploadA = await upload<Layer>(cluster, token, '/v1/layers?name=real-flat-a', flatA, 'real A flattened as a layer');
  const flatUploadB = await upload<Layer>(cluster, token, '/v1/layers?name=real-flat-b', flatB, 'real B flattened as a layer');
  const distinct = new Map([...a.body.layers, ...b.body.layers].map((l) => [l.digest, l.sizeBytes]));
  const storedLayered = [...distinct.values()].reduce((x, y) => x + y, 0);
  const storedFlattened = flatUploadA.body.sizeBytes + flatUploadB.body.sizeBytes;

  // They are images one can use: Python and Node run in sandboxes made from them.
  const run = async (image: string, cmd: string): Promise<string> => {
    const created = await api(cluster, token, 'POST', '/v1/sandboxes', { image: { base: image } });
    if (created.status !== 201) throw new Error(`create from ${image}: ${JSON.stringify(created.body)}`);
    try {
      const r = await api(cluster, token, 'POST', `/v1/sandboxes/${created.body.id}/exec`, { cmd });
      if (r.body.exitCode !== 0) throw new Error(`${image}: ${cmd}: ${r.body.stderr}`);
      return (r.body.stdout as string).trim();
    } finally {
      await api(cluster, token, 'DELETE', `/v1/sandboxes/${created.body.id}`);
    }
  };
  const pythonSays = await run('real-python', 'python3 -c "import json, sqlite3, ssl; print(json.dumps(sqlite3.sqlite_version_info[:1]))"');
  const nodeSays = await run('real-node', 'node -e "console.log(require(\'zod/package.json\').name)"');
  const figures = {
    baseMiB: round(base.tarBytes / MiB),
    topAMiB: round(python.tarBytes / MiB),
    topBMiB: round(node.tarBytes / MiB),
    archiveAMiB: round((await fs.stat(archiveA)).size / MiB),
    firstImportMs: round(a.ms),
    firstImportPeakRssGrowthMiB: a.peakRssGrowthMiB,
    secondImportMs: round(b.ms),
    secondImport: b.body.import,
    flattenedSecondUploadMs: round(flatUploadB.ms),
    storedBytesLayered: storedLayered,
    storedBytesFlattened: storedFlattened,
    storedRatio: round(storedLayered / storedFlattened),
    runs: { python: pythonSays, node: nodeSays },
  };
  log(`real pair: base ${figures.baseMiB} MiB + python ${figures.topAMiB} MiB / + node_modules ${figures.topBMiB} MiB; second import ${(b.ms / 1000).toFixed(2)} s (reused ${b.body.import.layersReused}) vs flattened ${(flatUploadB.ms / 1000).toFixed(2)} s; stored ${(storedLayered / MiB).toFixed(1)} MiB layered vs ${(storedFlattened / MiB).toFixed(1)} MiB flattened; python says ${pythonSays}, node says ${nodeSays}`);
  return figures;
}

// ---------------------------------------------------------------- HTTP

/**
 * POSTs a file as a streamed body, with a bar of the bytes sent; the answer and the wall time. `peakRssGrowthMiB`: how far this process's RSS (the gateway runs
 * in it) rose above where it was at the start, sampled every 50 ms: an archive is never held whole.
 */
async function upload<T>(cluster: TestCluster, token: string, urlPath: string, file: string, label: string): Promise<{ body: T; ms: number; peakRssGrowthMiB: number }> {
  const { size } = await fs.stat(file);
  const bar = progressBar(label, { total: size });
  let sent = 0;
  const counting = tap((chunk) => {
    sent += chunk.length;
    bar.update(sent / size, `${Math.floor(sent / MiB)}/${Math.round(size / MiB)} MiB${sent === size ? ', waiting for the answer' : ''}`);
  });
  const source = createReadStream(file);
  source.on('error', (err) => counting.destroy(err));
  const started = performance.now();
  const rssAtStart = process.memoryUsage.rss();
  let peakRss = rssAtStart;
  const sampler = setInterval(() => (peakRss = Math.max(peakRss, process.memoryUsage.rss())), 50);
  const response = await fetch(`${cluster.url}${urlPath}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/x-tar' },
    body: Readable.toWeb(source.pipe(counting)) as ReadableStream,
    duplex: 'half',
  } as RequestInit);
  const text = await response.text();
  const ms = performance.now() - started;
  clearInterval(sampler);
  bar.done();
  if (response.status !== 201) throw new Error(`POST ${urlPath}: ${response.status} ${text.slice(0, 2000)}`);
  return { body: JSON.parse(text) as T, ms, peakRssGrowthMiB: round((peakRss - rssAtStart) / MiB) };
}

async function get<T>(cluster: TestCluster, token: string, urlPath: string): Promise<T> {
  const r = await api<T>(cluster, token, 'GET', urlPath);
  if (r.status !== 200) throw new Error(`GET ${urlPath}: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
}

// ---------------------------------------------------------------- the run

const work = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-bench-import-'));
let cluster: TestCluster | undefined;
process.once('SIGINT', () => void Promise.allSettled([cluster?.stop(), fs.rm(work, { recursive: true, force: true })]).finally(() => process.exit(130)));
try {
  // 1. Generate: the layer tars, their gzip blobs, both archives, both flattened tars.
  const generateStarted = performance.now();
  const specs = generateImages(TOTAL_BYTES);
  const flatA = flatten('flat-a', specs.a);
  const flatB = flatten('flat-b', specs.b);
  const allLayers = [...specs.a, ...specs.b.slice(1)];
  const toWrite = [...allLayers, flatA, flatB];
  const genBar = progressBar('generating layer tars', { total: 1 });
  const genTotal = toWrite.reduce((s, l) => s + contentBytes(l), 0);
  let genDone = 0;
  const onBytes = (n: number) => {
    genDone += n;
    genBar.update(genDone / genTotal, `${Math.round(genDone / MiB)}/${Math.round(genTotal / MiB)} MiB`);
  };
  const tars = new Map<LayerSpec, { tar: string; diffId: string; tarBytes: number }>();
  for (const l of toWrite) {
    const tar = path.join(work, `${l.name}.tar`);
    tars.set(l, { tar, ...(await writeLayerTar(l, tar, onBytes)) });
  }
  genBar.done();
  const gzBar = progressBar(`gzip -${GZIP_LEVEL} of the layers`, { total: allLayers.length });
  const built = new Map<LayerSpec, BuiltLayer>();
  // Two at a time (the machine has two cores).
  const queue = [...allLayers];
  await Promise.all(
    [0, 1].map(async () => {
      for (let l = queue.shift(); l; l = queue.shift()) {
        const t = tars.get(l)!;
        const gz = `${t.tar}.gz`;
        const { digest, size } = await gzipFile(t.tar, gz, GZIP_LEVEL);
        built.set(l, { spec: l, ...t, gz, gzDescriptor: { mediaType: MEDIA_TYPES.layerGzip, digest, size } });
        gzBar.tick();
      }
    }),
  );
  gzBar.done();
  const layersA = specs.a.map((l) => built.get(l)!);
  const layersB = specs.b.map((l) => built.get(l)!);
  const archiveA = path.join(work, 'image-a.tar');
  const archiveB = path.join(work, 'image-b.tar');
  const archiveABytes = await writeOciArchive(archiveA, layersA, 'bench-a:latest', IMAGE_CONFIG);
  const archiveBBytes = await writeOciArchive(archiveB, layersB, 'bench-b:latest', IMAGE_CONFIG);
  const generateMs = performance.now() - generateStarted;

  const tarBytesA = layersA.reduce((s, l) => s + l.tarBytes, 0);
  const tarBytesB = layersB.reduce((s, l) => s + l.tarBytes, 0);
  const contentA = specs.a.reduce((s, l) => s + contentBytes(l), 0);
  const describe = (l: BuiltLayer) => `${l.spec.name}: ${l.spec.files.length} files, ${(l.tarBytes / MiB).toFixed(1)} MiB tar, ${(l.gzDescriptor.size / MiB).toFixed(1)} MiB gz`;
  log(`image A: ${layersA.map(describe).join('; ')}`);
  log(`image B: ${layersB.map(describe).join('; ')}`);
  log(`archives: A ${(archiveABytes / MiB).toFixed(1)} MiB, B ${(archiveBBytes / MiB).toFixed(1)} MiB; flattened tars: A ${(tars.get(flatA)!.tarBytes / MiB).toFixed(1)} MiB, B ${(tars.get(flatB)!.tarBytes / MiB).toFixed(1)} MiB (generated in ${(generateMs / 1000).toFixed(1)} s)`);

  // 2. The floor: tar -xf of each of A's layers, then mkfs.erofs with rollbox's flags; the
  // median of FLOOR_RUNS passes (one pass is noisy on a shared machine).
  const floorBar = progressBar('floor: tar -xf + mkfs.erofs', { total: FLOOR_RUNS * layersA.length });
  const passes: { extractMs: number; mkfsMs: number }[] = [];
  let floorErofsBytes = 0;
  for (let run = 0; run < FLOOR_RUNS; run++) {
    const pass = { extractMs: 0, mkfsMs: 0 };
    floorErofsBytes = 0;
    for (const [i, l] of layersA.entries()) {
      const dir = path.join(work, 'floor', String(i));
      const image = path.join(work, 'floor', `${i}.erofs`);
      await fs.mkdir(dir, { recursive: true });
      pass.extractMs += await timed(() => runToolOk('tar', ['-xf', l.tar, '-C', dir]));
      pass.mkfsMs += await timed(() => runToolOk('mkfs.erofs', ['--quiet', '-x-1', '-U', '00000000-0000-0000-0000-000000000000', '--preserve-mtime', image, dir]));
      floorErofsBytes += (await fs.stat(image)).size;
      await fs.rm(path.join(work, 'floor'), { recursive: true, force: true });
      floorBar.tick();
    }
    passes.push(pass);
  }
  floorBar.done();
  const median = (xs: number[]) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)]!;
  const extractMs = median(passes.map((p) => p.extractMs));
  const mkfsMs = median(passes.map((p) => p.mkfsMs));
  const floorMkfsMBps = round(tarBytesA / MB / (mkfsMs / 1000));
  const extractMBps = round(tarBytesA / MB / (extractMs / 1000));
  const floorExtractMkfsMBps = round(tarBytesA / MB / ((extractMs + mkfsMs) / 1000));
  log(`floor: tar -xf ${(extractMs / 1000).toFixed(2)} s (${extractMBps} MB/s), mkfs.erofs ${(mkfsMs / 1000).toFixed(2)} s (${floorMkfsMBps} MB/s), both ${floorExtractMkfsMBps} MB/s, EROFS ${(floorErofsBytes / MiB).toFixed(1)} MiB`);

  const common = {
    bench: 'import',
    imageMiB: round(tarBytesA / MiB),
    contentMiB: round(contentA / MiB),
    archiveMiB: round(archiveABytes / MiB),
    layers: layersA.length,
    files: specs.a.reduce((s, l) => s + l.files.length, 0),
    floorMkfsMBps,
    extractMBps,
    floorExtractMkfsMBps,
    floorMkfsMs: round(mkfsMs),
    floorExtractMs: round(extractMs),
    generateMs: round(generateMs),
  };
  if (DRY) {
    console.log(JSON.stringify({ ...common, dry: true, secondImageMiB: round(tarBytesB / MiB), secondArchiveMiB: round(archiveBBytes / MiB), floorErofsMiB: round(floorErofsBytes / MiB) }));
  } else {
    // 3. Import A, then B (on A's base), over HTTP.
    cluster = await startTestCluster({ workers: [{ nodeId: 'bench-import' }] });
    const token = await cluster.token('bench', ['layer:write', 'layer:read', 'sandbox:create', 'sandbox:exec', 'sandbox:delete']);
    const a = await upload<ImportedImage>(cluster, token, '/v1/images?name=bench-a', archiveA, 'import image A');
    const importMBps = round(tarBytesA / MB / (a.ms / 1000));
    log(`import A: ${(a.ms / 1000).toFixed(2)} s, ${importMBps} MB/s (floor: mkfs ${floorMkfsMBps} MB/s, tar -xf + mkfs ${floorExtractMkfsMBps} MB/s), built ${a.body.import.layersBuilt}, reused ${a.body.import.layersReused}`);
    const b = await upload<ImportedImage>(cluster, token, '/v1/images?name=bench-b', archiveB, 'import image B');
    log(`import B: ${(b.ms / 1000).toFixed(2)} s, built ${b.body.import.layersBuilt}, reused ${b.body.import.layersReused}`);

    // 4. The same two images uploaded flattened, one layer each.
    const flatUploadA = await upload<Layer>(cluster, token, '/v1/layers?name=bench-flat-a', tars.get(flatA)!.tar, 'flattened A as a layer');
    const flatUploadB = await upload<Layer>(cluster, token, '/v1/layers?name=bench-flat-b', tars.get(flatB)!.tar, 'flattened B as a layer');

    const [imageA, imageB] = [await get<Image>(cluster, token, '/v1/images/bench-a'), await get<Image>(cluster, token, '/v1/images/bench-b')];
    const distinct = new Map([...imageA.layers, ...imageB.layers].map((l) => [l.digest, l.sizeBytes]));
    const storedBytesLayered = [...distinct.values()].reduce((s, n) => s + n, 0);
    const flatSizes = [await get<Layer>(cluster, token, '/v1/layers/bench-flat-a'), await get<Layer>(cluster, token, '/v1/layers/bench-flat-b')].map((l) => l.sizeBytes);
    const storedBytesFlattened = flatSizes[0]! + flatSizes[1]!;
    log(`stored: layered ${(storedBytesLayered / MiB).toFixed(1)} MiB (${distinct.size} distinct layers) vs flattened ${(storedBytesFlattened / MiB).toFixed(1)} MiB; second image: import ${(b.ms / 1000).toFixed(2)} s vs flattened upload ${(flatUploadB.ms / 1000).toFixed(2)} s`);

    // 5. The pull arm: an image of this host's files (over 1 GB) from a loopback registry, against its floor (BENCH_IMPORT_PULL=0 leaves it out).
    const pull = process.env.BENCH_IMPORT_PULL === '0' ? undefined : await pullArms(work, GZIP_LEVEL, log);
    const pullChartPath = pull ? pullChart(pull, path.resolve(import.meta.dirname, 'out', 'pull.svg')) : undefined;

    const chart = writeSvg(
      path.resolve(import.meta.dirname, 'out', 'import.svg'),
      barChartsSvg(`Image import: ${layersA.length} layers, ${Math.round(tarBytesA / MiB)} MiB uncompressed (OCI layout, gzip)`, [
        {
          title: 'first image, MB/s of uncompressed layers',
          yLabel: 'MB/s',
          bars: [
            { label: 'floor: mkfs.erofs', value: floorMkfsMBps },
            { label: 'floor: tar -xf', value: extractMBps },
            { label: 'POST /v1/images', value: importMBps },
          ],
        },
        {
          title: 'second image on the same base, seconds',
          yLabel: 'seconds',
          bars: [
            { label: 'import (base shared)', value: b.ms / 1000 },
            { label: 'flattened upload', value: flatUploadB.ms / 1000 },
          ],
        },
        {
          title: 'both images stored, MiB',
          yLabel: 'MiB',
          bars: [
            { label: 'layered', value: storedBytesLayered / MiB },
            { label: 'flattened', value: storedBytesFlattened / MiB },
          ],
        },
      ]),
    );
    log(`chart: ${chart}`);
    // 6. A real image pair (this host's files); BENCH_IMPORT_REAL=0 leaves it out.
    const real = process.env.BENCH_IMPORT_REAL === '0' ? undefined : await realPair(cluster, token, work);
    console.log(
      JSON.stringify({
        ...common,
        importMs: round(a.ms),
        importMBps,
        ratioToFloor: round(importMBps / floorMkfsMBps),
        ratioToExtractMkfsFloor: round(importMBps / floorExtractMkfsMBps),
        firstImport: a.body.import,
        firstImportPeakRssGrowthMiB: a.peakRssGrowthMiB,
        secondImageMiB: round(tarBytesB / MiB),
        secondImportMs: round(b.ms),
        secondImportReusedLayers: b.body.import.layersReused,
        secondImportBuiltLayers: b.body.import.layersBuilt,
        flattenedFirstUploadMs: round(flatUploadA.ms),
        flattenedSecondUploadMs: round(flatUploadB.ms),
        storedBytesLayered,
        storedBytesFlattened,
        storedRatio: round(storedBytesLayered / storedBytesFlattened),
        ...(real ? { realPair: real } : {}),
        ...(pull ? { pull: { ...pull, chart: pullChartPath } } : {}),
        note: 'MB = 1e6 bytes of uncompressed layer tars (image A); floor = mkfs.erofs (rollbox flags) of the same layers extracted with tar -xf, same run; ratioToFloor = import MB/s / floor mkfs MB/s (ratioToExtractMkfsFloor: / tar -xf + mkfs); stored* = EROFS bytes of both images, distinct layers vs one flattened layer each; pull: see bench:pull (bench/support/pull-arm.ts)',
        chart,
      }),
    );
  }
} finally {
  await cluster?.stop();
  if (KEEP) log(`kept: ${work}`);
  else await fs.rm(work, { recursive: true, force: true });
}
