/**
 * bench:import's pull arm: the bench's image pushed into a loopback registry (Debian's
 * docker-registry), then, in the same run, `skopeo copy docker://... dir:...` of it (the
 * floor: blobs to files, digests checked), rollbox's registry client reading every blob
 * (the transfer alone, as a pull fetches them: ROLLBOX_IMAGE_PULL_LAYERS at once), and
 * `rollbox image pull` end to end (fetch, extract, EROFS build, record) against a gateway
 * of a fresh cluster (so every layer is built, none found stored). MB/s are of the
 * compressed blob bytes.
 */
import { execFile, spawn } from 'node:child_process';
import path from 'node:path';
import { Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { promisify } from 'node:util';
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
  pullMs: number;
  pullMBps: number;
  /** rollbox's transfer alone / skopeo (target 0.8). */
  transferRatioToSkopeo: number;
  /** `rollbox image pull` end to end / skopeo (fetch plus the EROFS build skopeo does not do). */
  pullRatioToSkopeo: number;
}

export async function pullArm(archive: string, work: string, log: (line: string) => void): Promise<PullArm> {
  let registry: TestRegistry | undefined;
  let cluster: TestCluster | undefined;
  try {
    registry = await startTestRegistry();
    const ref = `${registry.host}/bench/a:1`;
    log('pull arm: pushing the image into a loopback registry (skopeo)');
    await registry.push(archive, 'bench/a:1');
    const repo = new RegistryRepository(parseReference(ref), { credentials: new Map(), insecure: new Set([registry.host]), mirrors: new Map(), timeoutMs: 60_000 });
    const manifest = JSON.parse((await repo.manifest()).bytes.toString('utf8')) as { layers: { digest: string; size: number }[] };
    const blobBytes = manifest.layers.reduce((s, l) => s + l.size, 0);

    const skopeoMs = await timed(() => run('skopeo', ['copy', '--quiet', '--src-tls-verify=false', `docker://${ref}`, `dir:${path.join(work, 'skopeo-dir')}`], { timeout: 600_000 }));
    log(`pull arm: skopeo copy ${(skopeoMs / 1000).toFixed(2)} s, ${round(blobBytes / MB / (skopeoMs / 1000))} MB/s`);

    const transferMs = await timed(async () => {
      const queue = [...manifest.layers];
      const fetchNext = async (): Promise<void> => {
        for (let l = queue.shift(); l; l = queue.shift()) await pipeline(await repo.blobStream(l.digest, l.size), new Writable({ write: (_c, _e, done) => done() }));
      };
      await Promise.all(Array.from({ length: LAYERS_AT_ONCE }, fetchNext));
    });
    log(`pull arm: rollbox's client reading the blobs ${(transferMs / 1000).toFixed(2)} s, ${round(blobBytes / MB / (transferMs / 1000))} MB/s`);

    cluster = await startTestCluster({ env: { ROLLBOX_REGISTRY_INSECURE: registry.host } });
    const token = await cluster.token('bench-pull', ['layer:write']);
    let record: ImageRecord | undefined;
    const pullMs = await timed(async () => {
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
    const p = record!.pull!.progress;
    if (p.layersReused !== 0 || p.bytesFetched !== blobBytes) throw new Error(`the pull reused layers or fetched ${p.bytesFetched} of ${blobBytes} bytes: not a full pull`);
    log(`pull arm: rollbox image pull ${(pullMs / 1000).toFixed(2)} s, ${round(blobBytes / MB / (pullMs / 1000))} MB/s (${p.layersTotal} layers built)`);
    const skopeoMBps = round(blobBytes / MB / (skopeoMs / 1000));
    const transferMBps = round(blobBytes / MB / (transferMs / 1000));
    const pullMBps = round(blobBytes / MB / (pullMs / 1000));
    return {
      blobMB: round(blobBytes / MB),
      layers: manifest.layers.length,
      skopeoMs: round(skopeoMs),
      skopeoMBps,
      transferMs: round(transferMs),
      transferMBps,
      pullMs: round(pullMs),
      pullMBps,
      transferRatioToSkopeo: round(transferMBps / skopeoMBps),
      pullRatioToSkopeo: round(pullMBps / skopeoMBps),
    };
  } finally {
    await cluster?.stop();
    await registry?.stop();
  }
}
