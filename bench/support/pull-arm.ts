/**
 * bench:import's pull arm (also alone: `npm run bench:pull`), issue 42's point 4: an image of
 * this host's own files (over 1 GB of tars in four layers; `hostPullImage`), gzip and zstd,
 * pushed into a loopback registry (Debian's docker-registry). Its floor, measured in the
 * same run: `skopeo copy docker://... dir:...` of it (blobs to files, digests checked) plus
 * decompressing every blob to a file with the fastest tool on the machine (`zstd -d`, or the
 * faster of `gzip -d` and `pigz -d`), as many at once as a pull takes layers: what any pull
 * must do before it builds anything. Then `rollbox image pull` end to end (fetch, EROFS
 * build, record) against a gateway process of a fresh cluster (so every layer is built, none found
 * stored), and rollbox's registry client reading the blobs alone; the floor again after the pull
 * (this VM's speed drifts in a long run: the two are averaged). Last, a create naming the
 * ref on another fresh cluster (`POST /v1/run`: create, first command, delete) against the
 * pull plus the same run once the image is held. MB/s are of the compressed blob bytes.
 */
import { execFile, spawn } from 'node:child_process';
import { openSync, readFileSync } from 'node:fs';
import { readdir, rm, stat } from 'node:fs/promises';
import path from 'node:path';
import { Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { promisify } from 'node:util';
import type { ImageRecord } from '../../src/api/index.ts';
import { RegistryRepository, parseReference } from '../../src/oci-registry/index.ts';
import { barChartsSvg, progressBar, writeSvg, type BarPanel } from '../../src/report/index.ts';
import { api, startTestCluster, type TestCluster } from '../../test/support/cluster.ts';
import { startTestRegistry, type TestRegistry } from '../../test/support/registry.ts';
import { hostTar, writeOciArchive, zstdArchive, type LayerBlobs } from './oci-archive.ts';
import { timed } from './runc-floor.ts';

const run = promisify(execFile);
const REPO = path.resolve(import.meta.dirname, '../..');
const LAYERS_AT_ONCE = 3; // the gateway's default ROLLBOX_IMAGE_PULL_LAYERS
const MB = 1e6;
const round = (x: number) => Math.round(x * 100) / 100;
/** Issue 42: a pull within 1.25x of its floor (0.8 of its speed), and so a create from a ref never seen within 1.25x of that pull plus a create from the image held. */
const TARGET_RATIO = 1.25;
const MIN_IMAGE_BYTES = 1e9;
const HOST_EXCLUDES = ['--exclude=usr/lib/x86_64-linux-gnu/libLLVM*', '--exclude=*.a', '--exclude=usr/lib/x86_64-linux-gnu/valgrind', '--exclude=usr/lib/x86_64-linux-gnu/dri'];
/** The image's four layers, as an image of a language runtime on a distribution lays them out. */
const HOST_LAYERS: { name: string; args: string[] }[] = [
  { name: 'system', args: ['-C', '/', ...HOST_EXCLUDES, 'etc', 'bin', 'sbin', 'lib', 'lib64', 'usr/bin', 'usr/sbin', 'usr/lib64', 'usr/libexec', 'usr/include'] },
  { name: 'libraries', args: ['-C', '/', ...HOST_EXCLUDES, 'usr/lib/x86_64-linux-gnu'] },
  { name: 'share', args: ['-C', '/', 'usr/share'] },
  { name: 'apps', args: ['-C', '/', 'usr/lib/python3.11', 'usr/lib/python3', 'usr/lib/gcc', '-C', REPO, '--transform=s,^node_modules,opt/app/node_modules,', 'node_modules'] },
];
const HOST_IMAGE_CONFIG = { Env: ['PATH=/usr/local/bin:/usr/bin:/bin'], WorkingDir: '/opt/app' };

export interface HostPullImage {
  /** OCI archives of the same layers, gzip (level `gzipLevel`) and zstd (level 3). */
  gzip: string;
  zstd: string;
  layers: number;
  tarMB: number;
}

/** The pull arm's image: this host's files in four layers (over 1 GB of tars), as OCI archives in `work`. */
export async function hostPullImage(work: string, gzipLevel: number): Promise<HostPullImage> {
  const bar = progressBar('pull image: tar + gzip of host files', { total: HOST_LAYERS.length });
  const layers: LayerBlobs[] = new Array(HOST_LAYERS.length);
  let next = 0;
  // Two at a time (the machine has two cores).
  await Promise.all(
    [0, 1].map(async () => {
      for (let i = next++; i < HOST_LAYERS.length; i = next++) {
        layers[i] = await hostTar(path.join(work, `pull-${HOST_LAYERS[i]!.name}.tar`), HOST_LAYERS[i]!.args, gzipLevel);
        bar.tick();
      }
    }),
  );
  bar.done();
  const tarBytes = layers.reduce((s, l) => s + l.tarBytes, 0);
  if (tarBytes < MIN_IMAGE_BYTES) throw new Error(`the host's files make ${Math.round(tarBytes / MB)} MB of tars; the pull arm needs at least ${MIN_IMAGE_BYTES / MB}`);
  const gzip = path.join(work, 'pull-image-gzip.tar');
  await writeOciArchive(gzip, layers, 'bench-pull:gzip', HOST_IMAGE_CONFIG);
  const zstd = await zstdArchive(layers, path.join(work, 'pull-image-zstd.tar'), 'bench-pull:zstd', HOST_IMAGE_CONFIG);
  // The tars are not needed again (the archives hold the blobs).
  await Promise.all(layers.flatMap((l) => [rm(l.tar, { force: true }), rm(l.gz, { force: true }), rm(`${l.tar}.zst`, { force: true })]));
  return { gzip, zstd, layers: layers.length, tarMB: round(tarBytes / MB) };
}

export interface PullArm {
  /** The layers' compression. */
  compression: 'gzip' | 'zstd';
  layers: number;
  blobMB: number;
  skopeoMs: number;
  /** Decompressing every blob to a file, as many at once as a pull, with `decompressTool` (the fastest of those tried; the mean of the two passes). */
  decompressMs: number;
  decompressTool: string;
  /** Every tool tried, ms. */
  decompressToolsMs: Record<string, number>;
  /** skopeo copy + decompression: what any pull must do before it builds anything (the mean of the two passes). */
  floorMs: number;
  /** The floor measured before the pull and after it. */
  floorBeforeMs: number;
  floorAfterMs: number;
  /** `rollbox image pull` end to end (the CLI's start and polling included). */
  pullMs: number;
  /** The pull's own start to end on the gateway (its record's timestamps). */
  pullOnGatewayMs: number;
  /** pull / floor (target <= 1.25): end to end, and on the gateway. */
  pullToFloor: number;
  pullOnGatewayToFloor: number;
  /** rollbox's registry client reading every blob alone, ms, and skopeo / it (how the fetch alone compares). */
  transferMs: number;
  transferSpeedToSkopeo: number;
  /** What the layer store holds after the pull, and the bytes the gateway's process wrote to disk meanwhile. */
  storedMB: number;
  diskWrittenMB: number;
  /** `POST /v1/run` naming the ref on a fresh cluster (pulled first), then the median of 3 with the image held. */
  runFromUnseenRefMs: number;
  runFromHeldRefMs: number;
  /** runFromUnseenRef / (pull on the gateway + runFromHeldRef) (target <= 1.25). */
  unseenRefToPullPlusHeld: number;
}

/** A process's write_bytes (bytes it and its reaped children caused to be sent to storage; not tmpfs). */
function processWriteBytes(pid: number): number {
  return Number(/^write_bytes: (\d+)$/m.exec(readFileSync(`/proc/${pid}/io`, 'utf8'))?.[1] ?? 0);
}

async function allocatedBytes(dir: string): Promise<number> {
  let sum = 0;
  for (const name of await readdir(dir)) sum += (await stat(path.join(dir, name))).blocks * 512;
  return sum;
}

async function hasTool(tool: string): Promise<boolean> {
  return run('sh', ['-c', `command -v ${tool}`]).then(
    () => true,
    () => false,
  );
}

/** `tool -dc blob > out`. */
async function decompressToFile(tool: string, blob: string, out: string): Promise<void> {
  const child = spawn(tool, ['-dc', blob], { stdio: ['ignore', openSync(out, 'w'), 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const code = await new Promise<number | null>((r) => child.once('close', r));
  if (code !== 0) throw new Error(`${tool} -dc ${blob} exited ${code}: ${stderr.slice(0, 500)}`);
}

/** Dirty pages of an earlier step written out first, so no step pays for another's. */
const settleDisk = () => run('sync');

export async function pullArm(archive: string, work: string, log: (line: string) => void, compression: 'gzip' | 'zstd'): Promise<PullArm> {
  let registry: TestRegistry | undefined;
  let cluster: TestCluster | undefined;
  try {
    registry = await startTestRegistry();
    const ref = `${registry.host}/bench/pull:1`;
    log(`pull arm (${compression}): pushing the image into a loopback registry (skopeo)`);
    await registry.push(archive, 'bench/pull:1');
    const repo = new RegistryRepository(parseReference(ref), { credentials: new Map(), insecure: new Set([registry.host]), mirrors: new Map(), timeoutMs: 60_000, egress: { allowed: new Set(), internal: new Set([registry.host]) }, rateFloor: { minBytesPerSecond: 0, windowMs: 60_000 } });
    const manifest = JSON.parse((await repo.manifest()).bytes.toString('utf8')) as { layers: { digest: string; size: number }[] };
    const blobBytes = manifest.layers.reduce((s, l) => s + l.size, 0);
    const mbps = (ms: number) => round(blobBytes / MB / (ms / 1000));

    // The floor: skopeo's copy, then the blobs decompressed to files. Measured before the pull and
    // again after it, and the two averaged: this VM's speed drifts under a long run of load.
    const tools = compression === 'zstd' ? ['zstd'] : ['gzip', ...((await hasTool('pigz')) ? ['pigz'] : [])];
    const measureFloor = async (when: string): Promise<{ skopeoMs: number; toolsMs: Record<string, number> }> => {
      const skopeoDir = path.join(work, `skopeo-dir-${compression}`);
      await settleDisk();
      const skopeoMs = await timed(() => run('skopeo', ['copy', '--quiet', '--src-tls-verify=false', `docker://${ref}`, `dir:${skopeoDir}`], { timeout: 600_000 }));
      log(`pull arm (${compression}, floor ${when}): skopeo copy ${(skopeoMs / 1000).toFixed(2)} s, ${mbps(skopeoMs)} MB/s`);
      const toolsMs: Record<string, number> = {};
      for (const tool of tools) {
        const outDir = path.join(work, `decompressed-${compression}`);
        await run('mkdir', ['-p', outDir]);
        await settleDisk();
        toolsMs[tool] = await timed(async () => {
          const queue = [...manifest.layers];
          const next = async (): Promise<void> => {
            for (let l = queue.shift(); l; l = queue.shift()) {
              const hex = l.digest.replace(/^sha256:/, '');
              await decompressToFile(tool, path.join(skopeoDir, hex), path.join(outDir, `${hex}.tar`));
            }
          };
          await Promise.all(Array.from({ length: LAYERS_AT_ONCE }, next));
        });
        log(`pull arm (${compression}, floor ${when}): ${tool} -d of the blobs to files ${(toolsMs[tool]! / 1000).toFixed(2)} s`);
        await rm(outDir, { recursive: true, force: true });
      }
      await rm(skopeoDir, { recursive: true, force: true });
      return { skopeoMs, toolsMs };
    };
    const floorBefore = await measureFloor('before');

    await settleDisk();
    const transferMs = await timed(async () => {
      const queue = [...manifest.layers];
      const fetchNext = async (): Promise<void> => {
        for (let l = queue.shift(); l; l = queue.shift()) await pipeline(await repo.blobStream(l.digest, l.size), new Writable({ write: (_c, _e, done) => done() }));
      };
      await Promise.all(Array.from({ length: LAYERS_AT_ONCE }, fetchNext));
    });
    log(`pull arm (${compression}): rollbox's client reading the blobs ${(transferMs / 1000).toFixed(2)} s, ${mbps(transferMs)} MB/s`);

    // The pull, on a fresh cluster: every layer built.
    const clusterEnv = { ROLLBOX_REGISTRY_INSECURE: registry.host, ROLLBOX_REGISTRY_INTERNAL: registry.host };
    // The gateway in a process of its own, as deployed (not this one, whose heap the image's making and the floor's arms have grown).
    cluster = await startTestCluster({ env: clusterEnv });
    const pullGateway = await cluster.spawnGateway({ name: 'bench-pull-gw' });
    const pullToken = await cluster.token('bench-pull', ['layer:write']);
    let record: ImageRecord | undefined;
    await settleDisk();
    const writtenBefore = processWriteBytes(pullGateway.child.pid!);
    const pullMs = await timed(async () => {
      const child = spawn(process.execPath, [path.join(REPO, 'bin/rollbox.js'), 'image', 'pull', ref, '--name', 'bench-pulled', '--json', '--progress'], {
        env: { ...process.env, ROLLBOX_URL: pullGateway.url, ROLLBOX_TOKEN: pullToken },
        stdio: ['ignore', 'pipe', 'inherit'],
      });
      let out = '';
      child.stdout.on('data', (d: Buffer) => (out += d.toString()));
      const code = await new Promise<number | null>((r) => child.once('close', r));
      if (code !== 0) throw new Error(`rollbox image pull exited ${code}`);
      record = JSON.parse(out) as ImageRecord;
    });
    const diskWrittenBytes = processWriteBytes(pullGateway.child.pid!) - writtenBefore;
    const storeBytes = await allocatedBytes(path.join(cluster.rootDir, 'layers', 'sha256'));
    const p = record!.pull!.progress;
    if (p.layersReused !== 0 || p.bytesFetched !== blobBytes) throw new Error(`the pull reused layers or fetched ${p.bytesFetched} of ${blobBytes} bytes: not a full pull`);
    const pullOnGatewayMs = Date.parse(record!.pull!.finishedAt!) - Date.parse(record!.pull!.startedAt);
    log(`pull arm (${compression}): rollbox image pull ${(pullMs / 1000).toFixed(2)} s end to end, ${(pullOnGatewayMs / 1000).toFixed(2)} s on the gateway`);
    await cluster.stop();
    cluster = undefined;
    const floorAfter = await measureFloor('after');
    const skopeoMs = (floorBefore.skopeoMs + floorAfter.skopeoMs) / 2;
    const decompressToolsMs = Object.fromEntries(tools.map((t) => [t, round((floorBefore.toolsMs[t]! + floorAfter.toolsMs[t]!) / 2)]));
    const [decompressTool, decompressMs] = Object.entries(decompressToolsMs).sort((a, b) => a[1] - b[1])[0]!;
    const floorMs = skopeoMs + decompressMs;
    const floorOf = (f: typeof floorBefore) => round(f.skopeoMs + Math.min(...Object.values(f.toolsMs)));
    log(`pull arm (${compression}): floor ${(floorMs / 1000).toFixed(2)} s (skopeo + ${decompressTool} -d; ${(floorOf(floorBefore) / 1000).toFixed(2)} s before the pull, ${(floorOf(floorAfter) / 1000).toFixed(2)} s after): the pull ${round(pullOnGatewayMs / floorMs)}x on the gateway, ${round(pullMs / floorMs)}x end to end (target ${TARGET_RATIO})`);

    // A create naming the ref, never seen, on a fresh cluster with a worker host; then with the image held.
    cluster = await startTestCluster({ env: clusterEnv, workers: [{ nodeId: 'bench-pull-run' }] });
    const runGateway = await cluster.spawnGateway({ name: 'bench-run-gw' });
    const runToken = await cluster.token('bench-pull', ['layer:write', 'sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:run']);
    const runOnce = async (): Promise<number> =>
      timed(async () => {
        const r = await api(runGateway, runToken, 'POST', '/v1/run', { image: { ref }, cmd: 'test -d /opt/app/node_modules', resources: { memoryMiB: 128, diskMiB: 256 } });
        if (r.status !== 200 || r.body.status !== 'ok' || r.body.exitCode !== 0) throw new Error(`run from ${ref}: ${r.status} ${JSON.stringify(r.body).slice(0, 500)}`);
      });
    await settleDisk();
    const runFromUnseenRefMs = await runOnce();
    const held = [await runOnce(), await runOnce(), await runOnce()].sort((a, b) => a - b);
    const runFromHeldRefMs = held[1]!;
    const unseenRefToPullPlusHeld = round(runFromUnseenRefMs / (pullOnGatewayMs + runFromHeldRefMs));
    log(`pull arm (${compression}): run from the ref never seen ${(runFromUnseenRefMs / 1000).toFixed(2)} s, held ${(runFromHeldRefMs / 1000).toFixed(2)} s: ${unseenRefToPullPlusHeld}x the pull plus a held run (target ${TARGET_RATIO})`);

    return {
      compression,
      layers: manifest.layers.length,
      blobMB: round(blobBytes / MB),
      skopeoMs: round(skopeoMs),
      decompressMs: round(decompressMs),
      decompressTool,
      decompressToolsMs,
      floorMs: round(floorMs),
      floorBeforeMs: floorOf(floorBefore),
      floorAfterMs: floorOf(floorAfter),
      pullMs: round(pullMs),
      pullOnGatewayMs,
      pullToFloor: round(pullMs / floorMs),
      pullOnGatewayToFloor: round(pullOnGatewayMs / floorMs),
      transferMs: round(transferMs),
      transferSpeedToSkopeo: round(skopeoMs / transferMs),
      storedMB: round(storeBytes / MB),
      diskWrittenMB: round(diskWrittenBytes / MB),
      runFromUnseenRefMs: round(runFromUnseenRefMs),
      runFromHeldRefMs: round(runFromHeldRefMs),
      unseenRefToPullPlusHeld,
    };
  } finally {
    await cluster?.stop();
    await registry?.stop();
  }
}

/** Both arms of the pull bench on one host image; the chart's figures with them. */
export async function pullArms(work: string, gzipLevel: number, log: (line: string) => void): Promise<{ image: Omit<HostPullImage, 'gzip' | 'zstd'>; gzip: PullArm; zstd: PullArm; targetRatio: number }> {
  const image = await hostPullImage(work, gzipLevel);
  log(`pull image: ${image.layers} layers, ${image.tarMB} MB of tars`);
  const gzip = await pullArm(image.gzip, work, log, 'gzip');
  const zstd = await pullArm(image.zstd, work, log, 'zstd');
  return { image: { layers: image.layers, tarMB: image.tarMB }, gzip, zstd, targetRatio: TARGET_RATIO };
}

export type PullArms = Awaited<ReturnType<typeof pullArms>>;

/** The pull against its floor, seconds, each compression a panel: written to `file`, whose path it answers. */
export function pullChart(pull: PullArms, file: string): string {
  const panel = (arm: PullArm): BarPanel => ({
    title: `${arm.compression}: ${arm.blobMB} MB of blobs, seconds`,
    yLabel: 'seconds',
    bars: [
      { label: 'skopeo copy', value: arm.skopeoMs / 1000 },
      { label: `${arm.decompressTool} -d to files`, value: arm.decompressMs / 1000 },
      { label: 'floor (both)', value: arm.floorMs / 1000 },
      { label: 'pull, on the gateway', value: arm.pullOnGatewayMs / 1000 },
      { label: 'rollbox image pull', value: arm.pullMs / 1000 },
      { label: 'run, ref never seen', value: arm.runFromUnseenRefMs / 1000 },
    ],
  });
  return writeSvg(file, barChartsSvg(`Image pull from a loopback registry: ${pull.image.layers} layers, ${pull.image.tarMB} MB of tars (this host's files)`, [panel(pull.gzip), panel(pull.zstd)]));
}
