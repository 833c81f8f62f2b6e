/**
 * bench:import's pull arm: the bench's image pushed into a loopback registry (Debian's
 * docker-registry), then, in the same run, `skopeo copy docker://... dir:...` of it (the
 * floor: blobs to files, digests checked), rollbox's registry client reading every blob
 * (the transfer alone, as a pull fetches them: ROLLBOX_IMAGE_PULL_LAYERS at once), and
 * `rollbox image pull` end to end (fetch, EROFS build, record) against a gateway of a fresh
 * cluster (so every layer is built, none found stored): EROFS written from the tar stream
 * (the default), and the older build by extraction (trees on a tmpfs) then mkfs.erofs.
 * MB/s are of the compressed blob bytes. With `compression: 'zstd'` (the same image with
 * zstd layers): its floor is zstd's own decompression, and only the direct pull is timed.
 */
import { execFile, spawn } from 'node:child_process';
import { createReadStream, readFileSync } from 'node:fs';
import { readdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { promisify } from 'node:util';
import { createGunzip } from 'node:zlib';
import type { ImageRecord } from '../../src/api/index.ts';
import { RegistryRepository, parseReference } from '../../src/oci-registry/index.ts';
import { startTestCluster, type TestCluster } from '../../test/support/cluster.ts';
import { startTestRegistry, type TestRegistry } from '../../test/support/registry.ts';
import { timed } from './runc-floor.ts';

const run = promisify(execFile);
const REPO = path.resolve(import.meta.dirname, '../..');
const LAYERS_AT_ONCE = 3; // the gateway's default ROLLBOX_IMAGE_PULL_LAYERS
const MB = 1e6;
const round = (x: number) => Math.round(x * 100) / 100;

export interface PullArm {
  blobMB: number;
  layers: number;
  skopeoMs: number;
  skopeoMBps: number;
  transferMs: number;
  transferMBps: number;
  /** The layers' compression. */
  compression: 'gzip' | 'zstd';
  /** Decompressing every blob alone (zlib for gzip, the zstd tool for zstd, as many at once as a pull): a floor no pull of these layers can beat. */
  inflateMs: number;
  inflateMBps: number;
  /** `rollbox image pull` / inflating alone (1: the pull costs no more than decompression). */
  pullRatioToInflate: number;
  pullMs: number;
  pullMBps: number;
  /** rollbox's transfer alone / skopeo (target 0.8). */
  transferRatioToSkopeo: number;
  /** `rollbox image pull` end to end / skopeo (fetch plus the EROFS build skopeo does not do). */
  pullRatioToSkopeo: number;
  /** The pull's own start to end on the gateway (its record's timestamps: no CLI start, no polling), and skopeo / that. */
  pullOnGatewayMs: number;
  pullOnGatewayRatioToSkopeo: number;
  /** The same pull built by extraction (ROLLBOX_LAYER_BUILD=extract, trees on a tmpfs) and mkfs.erofs (gzip only). */
  pullExtractMs?: number;
  /** Direct / by extraction, end-to-end speed. */
  pullSpeedupOverExtract?: number;
  /** What the layer store holds after the pull (EROFS metadata images and data blobs). */
  storedMB: number;
  /** Bytes written to disk by the pull (the gateway's write_bytes, its mkfs.erofs children included); then the same built by extraction. */
  diskWrittenMB: number;
  diskWrittenExtractMB?: number;
  /** Disk written / stored: 1 is "written once, in its final form". */
  diskWrittenPerStored: number;
  diskWrittenPerStoredExtract?: number;
}

/** This process's write_bytes (bytes it and its reaped children caused to be sent to storage; not tmpfs). */
function processWriteBytes(): number {
  return Number(/^write_bytes: (\d+)$/m.exec(readFileSync('/proc/self/io', 'utf8'))?.[1] ?? 0);
}

async function allocatedBytes(dir: string): Promise<number> {
  let sum = 0;
  for (const name of await readdir(dir)) sum += (await stat(path.join(dir, name))).blocks * 512;
  return sum;
}

export async function pullArm(archive: string, work: string, log: (line: string) => void, compression: 'gzip' | 'zstd' = 'gzip'): Promise<PullArm> {
  let registry: TestRegistry | undefined;
  let cluster: TestCluster | undefined;
  try {
    registry = await startTestRegistry();
    const ref = `${registry.host}/bench/a:1`;
    log(`pull arm (${compression}): pushing the image into a loopback registry (skopeo)`);
    await registry.push(archive, 'bench/a:1');
    const repo = new RegistryRepository(parseReference(ref), { credentials: new Map(), insecure: new Set([registry.host]), mirrors: new Map(), timeoutMs: 60_000, egress: { allowed: new Set(), internal: new Set([registry.host]) }, rateFloor: { minBytesPerSecond: 0, windowMs: 60_000 } });
    const manifest = JSON.parse((await repo.manifest()).bytes.toString('utf8')) as { layers: { digest: string; size: number }[] };
    const blobBytes = manifest.layers.reduce((s, l) => s + l.size, 0);

    const skopeoDir = path.join(work, `skopeo-dir-${compression}`);
    const skopeoMs = await timed(() => run('skopeo', ['copy', '--quiet', '--src-tls-verify=false', `docker://${ref}`, `dir:${skopeoDir}`], { timeout: 600_000 }));
    log(`pull arm: skopeo copy ${(skopeoMs / 1000).toFixed(2)} s, ${round(blobBytes / MB / (skopeoMs / 1000))} MB/s`);

    // What any pull of these layers pays beyond skopeo: decompressing them (zlib as rollbox runs it, 256 KiB pieces; or the zstd tool, as rollbox runs it), as many at once as a pull.
    const inflateMs = await timed(async () => {
      const queue = [...manifest.layers];
      const blobOf = (digest: string) => path.join(skopeoDir, digest.replace(/^sha256:/, ''));
      const inflateNext = async (): Promise<void> => {
        for (let l = queue.shift(); l; l = queue.shift()) {
          if (compression === 'zstd') await run('zstd', ['-dcq', blobOf(l.digest), '-o', '/dev/null', '-f']);
          else await pipeline(createReadStream(blobOf(l.digest)), createGunzip({ chunkSize: 256 * 1024 }), new Writable({ write: (_c, _e, done) => done() }));
        }
      };
      await Promise.all(Array.from({ length: LAYERS_AT_ONCE }, inflateNext));
    });
    log(`pull arm: inflating the blobs alone ${(inflateMs / 1000).toFixed(2)} s, ${round(blobBytes / MB / (inflateMs / 1000))} MB/s`);

    const transferMs = await timed(async () => {
      const queue = [...manifest.layers];
      const fetchNext = async (): Promise<void> => {
        for (let l = queue.shift(); l; l = queue.shift()) await pipeline(await repo.blobStream(l.digest, l.size), new Writable({ write: (_c, _e, done) => done() }));
      };
      await Promise.all(Array.from({ length: LAYERS_AT_ONCE }, fetchNext));
    });
    log(`pull arm: rollbox's client reading the blobs ${(transferMs / 1000).toFixed(2)} s, ${round(blobBytes / MB / (transferMs / 1000))} MB/s`);

    // Twice, each on a fresh cluster: written from the stream (the default), then built by extraction.
    const pullOnce = async (buildEnv: Record<string, string>, label: string): Promise<{ ms: number; serverMs: number; diskBytes: number; storeBytes: number }> => {
      cluster = await startTestCluster({ env: { ROLLBOX_REGISTRY_INSECURE: registry!.host, ROLLBOX_REGISTRY_INTERNAL: registry!.host, ...buildEnv } });
      const token = await cluster.token('bench-pull', ['layer:write']);
      let record: ImageRecord | undefined;
      const writtenBefore = processWriteBytes();
      const ms = await timed(async () => {
        const child = spawn(process.execPath, [path.join(REPO, 'bin/rollbox.js'), 'image', 'pull', ref, '--name', 'bench-pulled', '--json', '--progress'], {
          env: { ...process.env, ROLLBOX_URL: cluster!.url, ROLLBOX_TOKEN: token },
          stdio: ['ignore', 'pipe', 'inherit'],
        });
        let out = '';
        child.stdout.on('data', (d: Buffer) => (out += d.toString()));
        const code = await new Promise<number | null>((r) => child.once('close', r));
        if (code !== 0) throw new Error(`rollbox image pull exited ${code}`);
        record = JSON.parse(out) as ImageRecord;
      });
      // The gateway runs in this process: its write_bytes count the trees its threads
      // extracted and, once reaped, what its mkfs.erofs children wrote (the store's files).
      const writtenBytes = processWriteBytes() - writtenBefore;
      const storeBytes = await allocatedBytes(path.join(cluster.rootDir, 'layers', 'sha256'));
      const p = record!.pull!.progress;
      // The gateway's own start-to-end of the pull, without the CLI's start and its polling.
      const serverMs = Date.parse(record!.pull!.finishedAt!) - Date.parse(record!.pull!.startedAt);
      if (p.layersReused !== 0 || p.bytesFetched !== blobBytes) throw new Error(`the pull reused layers or fetched ${p.bytesFetched} of ${blobBytes} bytes: not a full pull`);
      log(`pull arm (${label}): rollbox image pull ${(ms / 1000).toFixed(2)} s, ${round(blobBytes / MB / (ms / 1000))} MB/s (${p.layersTotal} layers built; ${(serverMs / 1000).toFixed(2)} s on the gateway), ${round(writtenBytes / MB)} MB written to disk (store ${round(storeBytes / MB)} MB)`);
      await cluster.stop();
      cluster = undefined;
      return { ms, serverMs, diskBytes: writtenBytes, storeBytes };
    };
    const direct = await pullOnce({}, `${compression}, EROFS from the stream`);
    const extracted = compression === 'gzip' ? await pullOnce({ ROLLBOX_LAYER_BUILD: 'extract' }, 'by extraction, trees on a tmpfs') : undefined;
    const pullMs = direct.ms;
    const skopeoMBps = round(blobBytes / MB / (skopeoMs / 1000));
    const transferMBps = round(blobBytes / MB / (transferMs / 1000));
    const pullMBps = round(blobBytes / MB / (pullMs / 1000));
    return {
      compression,
      blobMB: round(blobBytes / MB),
      layers: manifest.layers.length,
      skopeoMs: round(skopeoMs),
      skopeoMBps,
      transferMs: round(transferMs),
      transferMBps,
      inflateMs: round(inflateMs),
      inflateMBps: round(blobBytes / MB / (inflateMs / 1000)),
      pullRatioToInflate: round(inflateMs / pullMs),
      pullMs: round(pullMs),
      pullMBps,
      transferRatioToSkopeo: round(transferMBps / skopeoMBps),
      pullRatioToSkopeo: round(pullMBps / skopeoMBps),
      pullOnGatewayMs: round(direct.serverMs),
      pullOnGatewayRatioToSkopeo: round(skopeoMs / direct.serverMs),
      ...(extracted ? { pullExtractMs: round(extracted.ms), pullSpeedupOverExtract: round(extracted.ms / direct.ms) } : {}),
      storedMB: round(direct.storeBytes / MB),
      diskWrittenMB: round(direct.diskBytes / MB),
      ...(extracted ? { diskWrittenExtractMB: round(extracted.diskBytes / MB), diskWrittenPerStoredExtract: round(extracted.diskBytes / extracted.storeBytes) } : {}),
      diskWrittenPerStored: round(direct.diskBytes / direct.storeBytes),
    };
  } finally {
    await cluster?.stop();
    await registry?.stop();
  }
}
