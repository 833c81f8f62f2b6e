import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ImageRecord, Layer } from '../src/api/index.ts';
import { startGatewayRole } from '../src/roles/index.ts';
import { runRollbox } from './support/cli.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { busyboxEntries } from './support/image-fixture.ts';
import { layerTar, ociImage, ociLayout, type ImageDef } from './support/oci.ts';
import { pullEnded, pulled, startPull } from './support/pulls.ts';
import { startRegistryProxy, startTestRegistry, type RegistryProxy, type TestRegistry } from './support/registry.ts';

/**
 * Pulls against registries that ask for credentials (htpasswd, token), that fail in every
 * way a pull meets (wrong password, missing tag, a blob that does not match its digest, a
 * truncated blob, a registry killed mid-pull: each a coded error, nothing half-stored),
 * mirrors in front of a registry, plain HTTP only where configured, and the CLI.
 */

const BASIC_PASSWORD = `basic-${randomBytes(6).toString('hex')}`;
const TOKEN_PASSWORD = `token-${randomBytes(6).toString('hex')}`;

let anon: TestRegistry;
let basic: TestRegistry;
let tokenAuth: TestRegistry;
let origin: TestRegistry;
let mirror: TestRegistry;
let flaky: TestRegistry;
let flakyProxy: RegistryProxy;
let cluster: TestCluster;
let token: string;
let dir: string;
let authFile: string;

async function writeAuth(entries: Record<string, { username: string; password: string }>): Promise<void> {
  const auths = Object.fromEntries(Object.entries(entries).map(([host, c], i) => [host, i % 2 ? { username: c.username, password: c.password } : { auth: Buffer.from(`${c.username}:${c.password}`).toString('base64') }]));
  await fs.writeFile(authFile, JSON.stringify({ auths }));
}
const rightAuth = () => writeAuth({ [basic.host]: { username: 'puller', password: BASIC_PASSWORD }, [tokenAuth.host]: { username: 'puller', password: TOKEN_PASSWORD } });

async function image(tag: string, layerBytes = 32 * 1024, layers = 2): Promise<Buffer> {
  const defs = await Promise.all(Array.from({ length: layers }, (_, i) => layerTar([{ name: `srv/${tag}-${i}.bin`, content: randomBytes(layerBytes) }])));
  return ociLayout([{ layers: defs } satisfies ImageDef], { gzip: true });
}

async function storeFiles(): Promise<string[]> {
  return (await fs.readdir(path.join(cluster.rootDir, 'layers', 'sha256')).catch(() => [] as string[])).sort();
}
async function layerCount(): Promise<number> {
  return (await api<{ layers: Layer[] }>(cluster, token, 'GET', '/v1/layers')).body.layers.length;
}

beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-pull-registries-'));
  authFile = path.join(dir, 'auth.json');
  [anon, basic, tokenAuth, origin, mirror, flaky] = await Promise.all([
    startTestRegistry(),
    startTestRegistry({ kind: 'htpasswd', users: { puller: BASIC_PASSWORD } }),
    startTestRegistry({ kind: 'token', users: { puller: TOKEN_PASSWORD } }),
    startTestRegistry(),
    startTestRegistry(),
    startTestRegistry(),
  ]);
  flakyProxy = await startRegistryProxy(flaky.url);
  await rightAuth();
  cluster = await startTestCluster({
    env: {
      ROLLBOX_REGISTRY_INSECURE: [anon, basic, tokenAuth, origin, flaky].map((r) => r.host).concat(flakyProxy.host).join(','),
      // Loopback registries (and the token service's realm, the mirror, and a name for anon that resolves to loopback) are internal here.
      ROLLBOX_REGISTRY_INTERNAL: [anon, basic, tokenAuth, origin, mirror, flaky].map((r) => r.host).concat(flakyProxy.host, tokenAuth.tokenHost!, `localhost:${anon.host.split(':')[1]}`).join(','),
      ROLLBOX_REGISTRY_MIRRORS: `${origin.host}=${mirror.url}`,
      ROLLBOX_REGISTRY_AUTH_FILE: authFile,
      ROLLBOX_REGISTRY_TIMEOUT_MS: '5000',
    },
  });
  token = await cluster.token('pull-registries', ['layer:write']);
}, 120_000);
afterAll(async () => {
  // The registries first: they are ended by pid whatever becomes of the cluster's stop.
  await flakyProxy?.stop();
  for (const r of [anon, basic, tokenAuth, origin, mirror, flaky]) await r?.stop();
  await cluster?.stop();
  if (dir) await fs.rm(dir, { recursive: true, force: true });
});

describe('registry auth', () => {
  it('pulls with Basic (htpasswd) and Bearer-token credentials from the auth file; refused ones end registry_unauthorized and no answer or log holds them', async () => {
    const archive = await image('secret');
    await Promise.all([basic.push(archive, 't/secret:1'), tokenAuth.push(archive, 't/secret:1')]);
    const viaBasic = await pulled(cluster, token, { ref: `${basic.host}/t/secret:1`, name: 'secret-basic' });
    expect(viaBasic, JSON.stringify(viaBasic)).toMatchObject({ state: 'ready', pull: { state: 'ready' } });
    const tokensBefore = tokenAuth.tokenRequests.length;
    const viaToken = await pulled(cluster, token, { ref: `${tokenAuth.host}/t/secret:1`, name: 'secret-token' });
    expect(viaToken, JSON.stringify(viaToken)).toMatchObject({ state: 'ready', layers: viaBasic.layers });
    expect(tokenAuth.tokenRequests.slice(tokensBefore)).toContainEqual({ status: 200, withCredentials: true });
    // The registry checked the token: its manifest answer was a 200 to a request that carried it.
    expect(tokenAuth.served).toContainEqual({ method: 'GET', path: '/v2/t/secret/manifests/1', status: 200 });

    // A gateway whose log is kept (everything, at trace) pulls with wrong and with no credentials.
    const lines: string[] = [];
    const logged = await startGatewayRole(cluster.config, cluster.redisUrl, pino({ level: 'trace' }, { write: (s: string) => void lines.push(s) }));
    try {
      const before = { files: await storeFiles(), layers: await layerCount() };
      await writeAuth({ [basic.host]: { username: 'puller', password: `${BASIC_PASSWORD}-wrong` }, [tokenAuth.host]: { username: 'puller', password: `${TOKEN_PASSWORD}-wrong` } });
      const other = await image('secret-2');
      await Promise.all([basic.push(other, 't/secret:2'), tokenAuth.push(other, 't/secret:2')]);
      const answers: unknown[] = [];
      for (const registry of [basic, tokenAuth]) {
        const started = await startPull({ url: logged.url }, token, { ref: `${registry.host}/t/secret:2`, name: `wrong-${registry.auth.kind}` });
        answers.push(started);
        const failed = await pullEnded(cluster, token, started.name, started.pull!.id);
        answers.push(failed);
        expect(failed, JSON.stringify(failed)).toMatchObject({ state: 'failed', error: { code: 'registry_unauthorized' }, layers: [] });
        expect(failed.error!.message).toMatch(/refused the configured credentials/);
      }
      await writeAuth({});
      const anonymous = await startPull({ url: logged.url }, token, { ref: `${basic.host}/t/secret:2`, name: 'anonymous-basic' });
      const refused = await pullEnded(cluster, token, anonymous.name, anonymous.pull!.id);
      answers.push(refused);
      expect(refused).toMatchObject({ state: 'failed', error: { code: 'registry_unauthorized' } });
      expect(refused.error!.message).toMatch(/anonymous access/);
      expect(await storeFiles()).toEqual(before.files);
      expect(await layerCount()).toBe(before.layers);
      answers.push((await api(cluster, token, 'GET', '/v1/images')).body);

      const secrets = [BASIC_PASSWORD, TOKEN_PASSWORD, Buffer.from(`puller:${BASIC_PASSWORD}`).toString('base64'), Buffer.from(`puller:${TOKEN_PASSWORD}`).toString('base64')];
      const seen = `${JSON.stringify(answers)}\n${lines.join('')}`;
      expect(lines.some((l) => l.includes('image pull failed'))).toBe(true);
      for (const secret of secrets) expect(seen).not.toContain(secret);
      expect(seen).not.toMatch(/Basic [A-Za-z0-9+/=]{8,}/);
    } finally {
      await logged.stop();
      await rightAuth();
    }
  }, 120_000);
});

describe('a failed pull is a coded error and leaves nothing half-stored', () => {
  const cases: { what: string; ref: () => Promise<string>; code: string; message: RegExp; during?: (name: string) => Promise<void> }[] = [
    { what: 'a missing tag', ref: async () => `${anon.host}/t/nothing:here`, code: 'image_not_found', message: /MANIFEST_UNKNOWN/ },
    {
      what: 'a blob whose bytes do not match its digest',
      ref: async () => {
        const archive = await image('corrupt');
        await anon.push(archive, 't/corrupt:1');
        const blob = (await ociManifestOf(anon, 't/corrupt', '1')).layers[1]!.digest;
        const file = await fs.readFile(anon.blobFile(blob));
        file[4] = file[4]! ^ 0xff; // gzip MTIME: still a valid gzip of the same tar, another digest
        await fs.writeFile(anon.blobFile(blob), file);
        return `${anon.host}/t/corrupt:1`;
      },
      code: 'invalid_image',
      message: /its bytes hash to/,
    },
    {
      what: 'a truncated blob',
      ref: async () => {
        await anon.push(await image('cut'), 't/cut:1');
        const blob = (await ociManifestOf(anon, 't/cut', '1')).layers[1]!.digest;
        const file = anon.blobFile(blob);
        await fs.truncate(file, Math.floor((await fs.stat(file)).size / 2));
        return `${anon.host}/t/cut:1`;
      },
      code: 'invalid_image',
      message: /serves \d+ bytes, the manifest says \d+/,
    },
    {
      what: 'a registry that goes away mid-pull',
      ref: async () => {
        // One large blob: the registry cannot have written it all into its socket before it dies.
        await flaky.push(await image('gone', 24_000_000, 1), 't/gone:1');
        flakyProxy.setRate(400_000);
        return `${flakyProxy.host}/t/gone:1`;
      },
      code: 'registry_unavailable',
      message: /./,
      during: async (name) => {
        await waitFor('bytes of the pull', async () => ((await api<ImageRecord>(cluster, token, 'GET', `/v1/images/${name}`)).body.pull?.progress.bytesFetched ?? 0) > 100_000, 30_000);
        await flaky.kill();
      },
    },
  ];
  for (const c of cases) {
    it(`${c.what}: ${c.code}`, async () => {
      const ref = await c.ref();
      const before = { files: await storeFiles(), layers: await layerCount() };
      const started = await startPull(cluster, token, { ref });
      await c.during?.(started.name);
      const failed = await pullEnded(cluster, token, started.name, started.pull!.id);
      expect(failed, JSON.stringify(failed)).toMatchObject({ state: 'failed', error: { code: c.code }, layers: [] });
      expect(failed.error!.message).toMatch(c.message);
      expect(await storeFiles()).toEqual(before.files);
      expect(await layerCount()).toBe(before.layers);
      expect((await fs.readdir(path.join(cluster.rootDir, 'gateway', 'tmp')).catch(() => [])).filter((n) => n.startsWith('image-layer-'))).toEqual([]);
      // A failed image is listed, and can be deleted.
      expect((await api(cluster, token, 'DELETE', `/v1/images/${started.name}`)).status).toBe(200);
      expect((await api(cluster, token, 'GET', `/v1/images/${started.name}`)).status).toBe(404);
    }, 90_000);
  }
});

describe('mirrors and plain HTTP', () => {
  it('tries the mirror configured for a registry first and falls back to the registry', async () => {
    await mirror.push(await image('on-mirror'), 't/m:1');
    const viaMirror = await pulled(cluster, token, { ref: `${origin.host}/t/m:1` });
    expect(viaMirror, JSON.stringify(viaMirror)).toMatchObject({ state: 'ready', ref: `${origin.host}/t/m:1` });
    expect(mirror.served).toContainEqual({ method: 'GET', path: '/v2/t/m/manifests/1', status: 200 });
    expect(origin.served.filter((r) => r.path.startsWith('/v2/t/m/'))).toEqual([]);

    await origin.push(await image('on-origin'), 't/o:1');
    const fallback = await pulled(cluster, token, { ref: `${origin.host}/t/o:1` });
    expect(fallback, JSON.stringify(fallback)).toMatchObject({ state: 'ready' });
    expect(mirror.served).toContainEqual({ method: 'GET', path: '/v2/t/o/manifests/1', status: 404 });
    expect(origin.served).toContainEqual({ method: 'GET', path: '/v2/t/o/manifests/1', status: 200 });

    // The mirror down: the registry serves (every layer is held: only its manifest and config).
    await mirror.kill();
    const mirrorDown = await pulled(cluster, token, { ref: `${origin.host}/t/o:1` });
    expect(mirrorDown).toMatchObject({ state: 'ready', layers: fallback.layers, pull: { progress: { layersReused: 2, bytesFetched: 0 } } });
  }, 90_000);

  it('speaks plain HTTP only to registries listed as insecure', async () => {
    await anon.push(await image('plain'), 't/plain:1');
    const unlisted = await pulled(cluster, token, { ref: `localhost:${anon.host.split(':')[1]}/t/plain:1` });
    expect(unlisted, JSON.stringify(unlisted)).toMatchObject({ state: 'failed', error: { code: 'registry_unavailable' } });
    expect(unlisted.error!.message).toMatch(/list it in ROLLBOX_REGISTRY_INSECURE/);
    expect((await pulled(cluster, token, { ref: `${anon.host}/t/plain:1` })).state).toBe('ready');
  }, 60_000);
});

describe('rollbox image pull (CLI)', () => {
  const rollbox = (args: string[]) => runRollbox(args, { url: cluster.url, token, cwd: dir });

  it('pulls with a progress bar and a summary, or --json; a ref that cannot be pulled exits 1 with its code', async () => {
    const def: ImageDef = { layers: [await layerTar(busyboxEntries()), await layerTar([{ name: 'cli', content: randomBytes(300_000) }])] };
    await anon.push(await ociLayout([def], { gzip: true }), 't/cli:1');
    const run = await rollbox(['image', 'pull', `${anon.host}/t/cli:1`, '--name', 'cli-pulled', '--progress']);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toMatch(/^name\s+cli-pulled$/m);
    expect(run.stdout).toMatch(new RegExp(`^ref\\s+${anon.host}/t/cli:1$`, 'm'));
    expect(run.stdout).toMatch(new RegExp(`^digest\\s+${ociImage(def, { gzip: true }).manifest.descriptor.digest}$`, 'm'));
    expect(run.stdout).toMatch(/^layers\s+2 \(2 fetched, 0 reused\)$/m);
    expect(run.stdout).toMatch(/^fetched\s+[\d.]+ MB$/m);
    expect(run.stderr).toMatch(/\rcli-pulled\s+\[#{30}\]\s+100% 2\/2 layers, [\d.]+\/[\d.]+ MB, [\d.]+ MB\/s/);
    expect(run.stderr).toMatch(/\n$/);

    const again = await rollbox(['image', 'pull', `${anon.host}/t/cli:1`, '--name', 'cli-pulled', '--json']);
    expect(again.code, again.stderr).toBe(0);
    expect(again.stderr).toBe('');
    const record = JSON.parse(again.stdout) as ImageRecord;
    expect(record).toMatchObject({ name: 'cli-pulled', state: 'ready', pull: { state: 'ready', progress: { layersReused: 2, bytesFetched: 0 } } });
    expect(record).toEqual((await api(cluster, token, 'GET', '/v1/images/cli-pulled')).body);

    const missing = await rollbox(['image', 'pull', `${anon.host}/t/cli:missing`]);
    expect(missing.code).toBe(1);
    expect(missing.stdout).toBe('');
    expect(missing.stderr).toMatch(/^rollbox: image_not_found: .*MANIFEST_UNKNOWN/m);
  }, 90_000);
});

/** The manifest a registry holds for repo:tag (read as skopeo would, anonymous). */
async function ociManifestOf(registry: TestRegistry, repo: string, tag: string): Promise<{ layers: { digest: string; size: number }[] }> {
  const r = await fetch(`${registry.url}/v2/${repo}/manifests/${tag}`, { headers: { accept: 'application/vnd.oci.image.manifest.v1+json' } });
  return (await r.json()) as { layers: { digest: string; size: number }[] };
}
