import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Image, ImportedImage } from '../src/api/index.ts';
import { ImagesClient, RollboxClient } from '../src/client/index.ts';
import { api, startTestCluster, type TestCluster } from './support/cluster.ts';
import { dockerSave, layerTar, ociImage, ociLayout, type ImageDef } from './support/oci.ts';

/**
 * `rollbox image` against a real gateway (no worker host: an import only builds layers),
 * with small archives built in memory: a base layer of a few files under images that share it.
 */

const REPO_ROOT = path.resolve(import.meta.dirname, '..');

let cluster: TestCluster;
let token: string;
let dir: string;
let base: Buffer;

interface CliRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** The real `rollbox` command as a child process; `stdin`: bytes piped to it (else none). */
function rollbox(args: string[], options: { stdin?: Buffer } = {}): Promise<CliRun> {
  const child = spawn(process.execPath, [path.join(REPO_ROOT, 'bin/rollbox.js'), ...args], {
    cwd: dir,
    env: { ...process.env, ROLLBOX_URL: cluster.url, ROLLBOX_TOKEN: token },
    stdio: [options.stdin ? 'pipe' : 'ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  child.stdin?.on('error', () => undefined); // an early exit closes the pipe: the answer says why
  child.stdin?.end(options.stdin);
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, stdout, stderr }));
  });
}

function writeArchive(name: string, bytes: Buffer): string {
  const file = path.join(dir, name);
  fs.writeFileSync(file, bytes);
  return file;
}

/** An image of the shared base and one layer of its own. */
async function withBase(tag: string, config: ImageDef['config'] = {}): Promise<ImageDef> {
  const own = await layerTar([{ name: `srv/${tag}/`, type: 'directory' }, { name: `srv/${tag}/app`, content: `${tag}\n`, mode: 0o755 }]);
  return { layers: [base, own], config };
}

async function getImage(name: string): Promise<Image> {
  const answer = await api<Image>(cluster, token, 'GET', `/v1/images/${name}`);
  expect(answer.status).toBe(200);
  return answer.body;
}

beforeAll(async () => {
  cluster = await startTestCluster();
  token = await cluster.token('img-cli', ['layer:write']);
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rollbox-image-cli-'));
  base = await layerTar([
    { name: 'etc/', type: 'directory' },
    { name: 'etc/os-release', content: 'ID=cli-test\n' },
    { name: 'etc/passwd', content: 'root:x:0:0:root:/root:/bin/sh\n' },
    { name: 'usr/share/', type: 'directory' },
    { name: 'usr/share/data.bin', content: Buffer.alloc(200_000, 7) },
  ]);
});
afterAll(async () => {
  await cluster?.stop();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

describe('rollbox image (CLI)', () => {
  it('imports an OCI layout file: progress on stderr, then the summary; a second image reuses the shared base', async () => {
    const def = await withBase('a', { Env: ['MODE=a'], WorkingDir: '/srv/a' });
    const file = writeArchive('a.tar', await ociLayout([def]));
    const run = await rollbox(['image', 'import', file, '--name', 'cli-a', '--progress']);
    expect(run.code).toBe(0);
    expect(run.stdout).toMatch(/^name\s+cli-a$/m);
    expect(run.stdout).toMatch(new RegExp(`^digest\\s+${ociImage(def).manifest.descriptor.digest}$`, 'm'));
    expect(run.stdout).toMatch(/^platform\s+linux\/amd64$/m);
    expect(run.stdout).toMatch(/^layers\s+2 \(2 built, 0 reused\)$/m);
    expect(run.stdout).toMatch(/^size\s+\d+\.\d+ MiB$/m);
    expect(run.stdout).toMatch(/^archive\s+\d+\.\d+ MB read$/m);
    expect(run.stdout).toMatch(/^time\s+[\d.]+ s$/m);
    // The bar: the file's bytes with a rate, then the wait for the gateway's build; the line ends.
    const size = (fs.statSync(file).size / 1e6).toFixed(2);
    expect(run.stderr).toMatch(/\ra\.tar\s+\[[#.]+\]\s+\d+% [\d.]+\/[\d.]+ MB, [\d.]+ MB\/s/);
    expect(run.stderr).toContain(`${size}/${size} MB sent (`);
    expect(run.stderr).toMatch(/waiting for the layers to build \d+ s\s*\n$/);
    expect(run.stderr).not.toContain('rollbox:');

    const second = await rollbox(['image', 'import', writeArchive('b.tar', await ociLayout([await withBase('b')])), '--name', 'cli-b']);
    expect(second.code).toBe(0);
    expect(second.stderr).toBe(''); // not a terminal and no --progress: no bar
    expect(second.stdout).toMatch(/^layers\s+2 \(1 built, 1 reused\)$/m);
  }, 60_000);

  it('--json prints the imported image: the record GET /v1/images/NAME answers, with the import report', async () => {
    const run = await rollbox(['image', 'import', writeArchive('c.tar', await dockerSave(await withBase('c'))), '--name', 'cli-c', '--json']);
    expect(run.code).toBe(0);
    const imported = JSON.parse(run.stdout) as ImportedImage;
    expect(imported.import).toMatchObject({ layersBuilt: 1, layersReused: 1, archiveBytes: fs.statSync(path.join(dir, 'c.tar')).size });
    const { import: report, ...record } = imported;
    expect(report.durationMs).toBeGreaterThan(0);
    expect(record).toEqual(await getImage('cli-c'));
  }, 60_000);

  it('imports from stdin (-): bytes and rate, no total', async () => {
    const run = await rollbox(['image', 'import', '-', '--name', 'cli-stdin', '--platform', 'linux/arm64', '--progress'], {
      stdin: await ociLayout([{ ...(await withBase('d')), architecture: 'arm64' }]),
    });
    expect(run.code).toBe(0);
    expect(run.stdout).toMatch(/^name\s+cli-stdin$/m);
    expect(run.stdout).toMatch(/^platform\s+linux\/arm64$/m);
    expect(run.stdout).toMatch(/^layers\s+2 \(1 built, 1 reused\)$/m);
    expect(run.stderr).toMatch(/^\rcli-stdin \(stdin\)\s+[\d.]+ MB/);
    expect(run.stderr).not.toContain('[');
    expect(run.stderr).toMatch(/[\d.]+ MB sent \([\d.]+ MB\/s\), waiting for the layers to build/);
    expect((await getImage('cli-stdin')).layers).toHaveLength(2);
  }, 60_000);

  it('lists, shows and deletes; a deleted image is not_found', async () => {
    const list = await rollbox(['image', 'list']);
    expect(list.code).toBe(0);
    expect(list.stdout).toMatch(/^NAME\s+PLATFORM\s+LAYERS\s+SIZE MiB\s+CREATED\s+SYNCED\s+STATE$/m);
    for (const name of ['cli-a', 'cli-b']) expect(list.stdout).toMatch(new RegExp(`^${name}\\s+linux/amd64\\s+2\\s+\\d+\\.\\d+\\s+\\d{4}-\\S+\\s+(yes|no)\\s+ready$`, 'm'));
    const listJson = JSON.parse((await rollbox(['image', 'list', '--json'])).stdout) as { images: Image[] };
    expect(listJson.images.map((i) => i.name)).toEqual(expect.arrayContaining(['cli-a', 'cli-b', 'cli-c']));

    const show = await rollbox(['image', 'show', 'cli-a']);
    expect(show.code).toBe(0);
    const shown = JSON.parse(show.stdout) as Image;
    expect(shown).toEqual(await getImage('cli-a'));
    expect(shown.config).toMatchObject({ Env: ['MODE=a'], WorkingDir: '/srv/a' });
    expect(show.stdout).toContain('\n  "name": "cli-a"'); // pretty-printed

    const del = await rollbox(['image', 'delete', 'cli-b']);
    expect(del).toMatchObject({ code: 0, stdout: 'cli-b deleted\n', stderr: '' });
    const gone = await rollbox(['image', 'show', 'cli-b']);
    expect(gone.code).toBe(1);
    expect(gone.stdout).toBe('');
    expect(gone.stderr).toMatch(/^rollbox: not_found: /);
    expect((await rollbox(['image', 'list'])).stdout).not.toMatch(/^cli-b\s/m);
  }, 60_000);

  it('a malformed archive exits 1 with rollbox: invalid_image: ... and leaves no image; a missing file names itself', async () => {
    const file = writeArchive('broken.tar', await ociLayout([await withBase('e')], { corrupt: { kind: 'missing-blob', layer: 1 } }));
    const run = await rollbox(['image', 'import', file, '--name', 'cli-broken']);
    expect(run.code).toBe(1);
    expect(run.stdout).toBe('');
    expect(run.stderr).toMatch(/^rollbox: invalid_image: /);
    expect((await api(cluster, token, 'GET', '/v1/images/cli-broken')).status).toBe(404);

    const missing = await rollbox(['image', 'import', path.join(dir, 'nope.tar'), '--name', 'cli-nope']);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/^rollbox: ENOENT: .*nope\.tar/);
  }, 60_000);
});

describe('ImagesClient', () => {
  it('imports bytes (again: the same image, nothing built), a stream, and reads and deletes', async () => {
    const client = new ImagesClient(new RollboxClient({ baseUrl: cluster.url, token }));
    const archive = await ociLayout([await withBase('f')]);
    const first = await client.importImage(new Uint8Array(archive), { name: 'client-f' });
    expect(first.import).toMatchObject({ layersBuilt: 1, layersReused: 1, archiveBytes: archive.length });
    const again = await client.importImage(new Uint8Array(archive), { name: 'client-f' });
    expect(again).toMatchObject({ digest: first.digest, layers: first.layers, import: { layersBuilt: 0, layersReused: 2 } });

    async function* chunks() {
      for (let i = 0; i < archive.length; i += 4096) yield archive.subarray(i, i + 4096);
    }
    const streamed = await client.importImage(chunks(), { name: 'client-g' });
    expect(streamed.digest).toBe(first.digest);
    expect((await client.getImage('client-g')).layers).toEqual(first.layers);
    expect((await client.listImages()).map((i) => i.name)).toEqual(expect.arrayContaining(['client-f', 'client-g']));
    expect((await client.deleteImage('client-g')).name).toBe('client-g');
    await expect(client.getImage('client-g')).rejects.toMatchObject({ code: 'not_found', status: 404 });
    await expect(client.importImage(archive.subarray(0, 3000), { name: 'client-cut' })).rejects.toMatchObject({ code: 'invalid_image', status: 400 });
  }, 60_000);
});
