import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import type { ServerResponse } from 'node:http';
import path from 'node:path';
import { gzipSync } from 'node:zlib';
import { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ImageRecord, Layer } from '../src/api/index.ts';
import { keys } from '../src/registry/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { startHostileRegistry, trickle, type HostileRegistry } from './support/hostile-registry.ts';
import { MEDIA_TYPES, digestOf, layerTar, ociImage } from './support/oci.ts';
import { pullEnded, startPull } from './support/pulls.ts';

/**
 * Pulls from a registry that lies (issue 38): crafted configs, sizes and blobs, tokens,
 * redirects to places a gateway must not go, and bodies trickled a byte at a time. Each pull
 * ends coded within its deadline, stores nothing (no layer file, no layer record, no image),
 * and leaves `GET /v1/images` and layer garbage collection working; records an older
 * version stored under looser rules are skipped, reported and deletable.
 */

const DEADLINE_MS = 8000;
const TIMEOUT_MS = 3000;

let cluster: TestCluster;
let token: string;
/** The registry under test: internal (loopback, listed), in the allowlist. */
let hostile: HostileRegistry;
/** A second internal registry, for token services and blob stores a redirect names. */
let helper: HostileRegistry;
/** A loopback server that is not listed internal: the gateway must never reach it. */
let outsider: HostileRegistry;
let redis: Redis;

const tar = await layerTar([{ name: 'hello', content: 'hi\n' }]);
const sound = ociImage({ layers: [tar], config: { Env: ['PATH=/bin'] } }, { gzip: true });
type Json = Record<string, any>;

type CraftedLayer = { blob: Buffer; mediaType: string; size?: number; diffId?: string };

/** A layer no pull has stored yet (a layer held by its diff_id or blob digest is not fetched again): a gzipped tar of `bytes` random bytes. */
async function freshLayer(bytes = 64): Promise<CraftedLayer> {
  const t = await layerTar([{ name: `f-${randomBytes(6).toString('hex')}`, content: randomBytes(bytes) }]);
  return { blob: gzipSync(t), mediaType: MEDIA_TYPES.layerGzip, diffId: digestOf(t) };
}

/** An image whose config, layers or manifest the test changed; digests made to match (a registry lying consistently). */
function craft(opts: { config?: (c: Json) => Json; layers?: CraftedLayer[]; diffIds?: string[]; manifest?: (m: Json) => Json } = {}) {
  const layers: CraftedLayer[] = opts.layers ?? sound.layers.map((l) => ({ blob: l.blob, mediaType: l.descriptor.mediaType }));
  const baseConfig = JSON.parse(sound.config.blob.toString()) as Json;
  const diffIds = opts.diffIds ?? (opts.layers?.every((l) => l.diffId) ? opts.layers.map((l) => l.diffId!) : undefined);
  if (diffIds) baseConfig.rootfs.diff_ids = diffIds;
  const config = Buffer.from(JSON.stringify((opts.config ?? ((c) => c))(baseConfig)));
  const manifest = {
    schemaVersion: 2,
    mediaType: MEDIA_TYPES.manifest,
    config: { mediaType: MEDIA_TYPES.config, digest: digestOf(config), size: config.length },
    layers: layers.map((l) => ({ mediaType: l.mediaType, digest: digestOf(l.blob), size: l.size ?? l.blob.length })),
  };
  return { manifest: Buffer.from(JSON.stringify((opts.manifest ?? ((m) => m))(manifest))), blobs: [config, ...layers.map((l) => l.blob)] };
}

async function storeFiles(): Promise<string[]> {
  return (await fs.readdir(path.join(cluster.rootDir, 'layers', 'sha256')).catch(() => [] as string[])).sort();
}
async function layerCount(): Promise<number> {
  return (await api<{ layers: Layer[] }>(cluster, token, 'GET', '/v1/layers')).body.layers.length;
}

/** Pulls `ref` into `name` and checks how it ended: the code, the message, within the deadline, nothing stored, the listing whole. */
async function failsCoded(name: string, ref: string, code: string, message: RegExp): Promise<ImageRecord> {
  const before = { files: await storeFiles(), layers: await layerCount() };
  const startedMs = Date.now();
  const started = await startPull(cluster, token, { ref, name });
  const failed = await pullEnded(cluster, token, name, started.pull!.id, DEADLINE_MS + 5000);
  const tookMs = Date.now() - startedMs;
  expect(failed, JSON.stringify(failed).slice(0, 2000)).toMatchObject({ state: 'failed', error: { code }, layers: [] });
  expect(failed.error!.message).toMatch(message);
  expect(tookMs).toBeLessThan(DEADLINE_MS + 3000);
  // Small whatever the registry sent (no foreign text quoted, nothing huge echoed).
  expect(JSON.stringify(failed).length).toBeLessThan(4096);
  // Nothing added (the janitor may take what earlier cases left meanwhile).
  expect((await storeFiles()).filter((f) => !before.files.includes(f))).toEqual([]);
  expect(await layerCount()).toBeLessThanOrEqual(before.layers);
  const list = await api<{ images: ImageRecord[] }>(cluster, token, 'GET', '/v1/images');
  expect(list.status).toBe(200);
  expect(list.body.images.find((i) => i.name === name)).toMatchObject({ state: 'failed', layers: [] });
  expect((await api(cluster, token, 'DELETE', `/v1/images/${name}`)).status).toBe(200);
  return failed;
}

beforeAll(async () => {
  [hostile, helper, outsider] = await Promise.all([startHostileRegistry(), startHostileRegistry(), startHostileRegistry()]);
  cluster = await startTestCluster({
    workers: [{ nodeId: 'node-hostile' }],
    env: {
      ROLLBOX_REGISTRY_INSECURE: [hostile.host, helper.host, outsider.host].join(','),
      ROLLBOX_REGISTRY_INTERNAL: [hostile.host, helper.host].join(','),
      // `localhost` on any port passes the allowlist; that name still resolves to loopback, checked at connect.
      ROLLBOX_REGISTRY_ALLOW: [hostile.host, helper.host, outsider.host, 'localhost'].join(','),
      ROLLBOX_REGISTRY_TIMEOUT_MS: String(TIMEOUT_MS),
      ROLLBOX_IMAGE_PULL_DEADLINE_MS: String(DEADLINE_MS),
      ROLLBOX_IMAGE_PULL_MIN_BYTES_PER_S: '2048',
      ROLLBOX_IMAGE_PULL_RATE_WINDOW_MS: '1000',
      ROLLBOX_LAYER_GC_GRACE_MS: '0',
      ROLLBOX_LAYER_GC_INTERVAL_MS: '300',
    },
  });
  token = await cluster.token('hostile', ['layer:write', 'sandbox:create', 'sandbox:read', 'sandbox:delete', 'sandbox:exec']);
  redis = new Redis(cluster.redisUrl);
}, 120_000);
afterAll(async () => {
  for (const r of [hostile, helper, outsider]) await r?.stop();
  redis?.disconnect();
  await cluster?.stop();
});

describe('what a registry serves is checked before anything is stored', () => {
  const platformOf = (os: string, architecture: string, variant?: string) => (c: Json) => ({ ...c, os, architecture, ...(variant ? { variant } : {}) });
  const withConfig = (fields: Json) => (c: Json) => ({ ...c, config: { ...c.config, ...fields } });
  const cases: { what: string; image: () => ReturnType<typeof craft>; code: string; message: RegExp }[] = [
    { what: 'a config whose variant is "V8"', image: () => craft({ config: platformOf('linux', 'amd64', 'V8') }), code: 'invalid_image', message: /image config: its platform .*"linux\/amd64\/V8" is not os\/architecture/ },
    { what: 'a layer size of 1.5', image: () => craft({ layers: [{ ...sound.layers[0]!.descriptor, blob: sound.layers[0]!.blob, size: 1.5 }] }), code: 'invalid_image', message: /layers\.0\.size: / },
    { what: 'a layer size of 1e300', image: () => craft({ layers: [{ ...sound.layers[0]!.descriptor, blob: sound.layers[0]!.blob, size: 1e300 }] }), code: 'invalid_image', message: /layers\.0\.size: / },
    { what: 'an Env value over 32 KiB', image: () => craft({ config: withConfig({ Env: ['PATH=/bin', `BIG=${'x'.repeat(40_000)}`] }) }), code: 'invalid_image', message: /config\.Env\.1: Too big/ },
    { what: 'a NUL in Env', image: () => craft({ config: withConfig({ Env: ['A=x\u0000y'] }) }), code: 'invalid_image', message: /config\.Env\.0: must not contain NUL/ },
    { what: '3.8 MB of Env', image: () => craft({ config: withConfig({ Env: Array.from({ length: 125 }, (_, i) => `V${i}=${'x'.repeat(30_000)}`) }) }), code: 'invalid_image', message: /config\.Env: env holds more than/ },
    { what: 'a NUL in WorkingDir', image: () => craft({ config: withConfig({ WorkingDir: '/app\u0000/x' }) }), code: 'invalid_image', message: /config\.WorkingDir: must not contain NUL/ },
    { what: 'a User of nobody:../../etc', image: () => craft({ config: withConfig({ User: 'nobody:../../etc' }) }), code: 'invalid_image', message: /config\.User: / },
    { what: 'an 8 MB architecture', image: () => craft({ config: platformOf('linux', 'a'.repeat(3_000_000)) }), code: 'invalid_image', message: /platform .* of 3000006 characters/ },
    {
      what: 'a garbage zstd blob whose config names the empty tar',
      image: () => craft({ layers: [{ blob: Buffer.concat([Buffer.from([0x28, 0xb5, 0x2f, 0xfd]), randomBytes(4000)]), mediaType: MEDIA_TYPES.layerZstd }], diffIds: [digestOf(Buffer.alloc(0))] }),
      code: 'invalid_layer',
      message: /zstd/,
    },
    {
      what: 'a cut zstd blob',
      image: () => {
        const zstd = execFileSync('zstd', ['-q', '-c'], { input: Buffer.concat([tar, randomBytes(200_000)]) });
        return craft({ layers: [{ blob: zstd.subarray(0, zstd.length >> 1), mediaType: MEDIA_TYPES.layerZstd }], diffIds: [digestOf(Buffer.alloc(0))] });
      },
      code: 'invalid_layer',
      message: /^layer .*: (bad zstd data|entry .* is truncated|malformed tar)/,
    },
    { what: 'a garbage gzip blob', image: () => craft({ layers: [{ blob: Buffer.concat([gzipSync(tar).subarray(0, 10), randomBytes(4000)]), mediaType: MEDIA_TYPES.layerGzip }] }), code: 'invalid_layer', message: /gzip/ },
  ];
  for (const [i, c] of cases.entries()) {
    it(`${c.what}: ${c.code}`, async () => {
      hostile.image(`bad/c${i}`, '1', c.image());
      await failsCoded(`bad-c${i}`, `${hostile.host}/bad/c${i}:1`, c.code, c.message);
    }, 30_000);
  }

  it('an index saying linux/amd64 over a config saying Linux/x86-64: invalid_image', async () => {
    const inner = craft({ config: platformOf('Linux', 'x86-64') });
    hostile.image('bad/index', 'inner', inner);
    const index = Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: MEDIA_TYPES.index, manifests: [{ mediaType: MEDIA_TYPES.manifest, digest: digestOf(inner.manifest), size: inner.manifest.length, platform: { os: 'linux', architecture: 'amd64' } }] }));
    hostile.image('bad/index', '1', { manifest: index });
    await failsCoded('bad-index', `${hostile.host}/bad/index:1`, 'invalid_image', /"Linux\/x86-64" is not os\/architecture/);
  }, 30_000);

  it('a create naming such an image is refused at the gateway, coded, and the tenant\'s sandboxes stay readable', async () => {
    hostile.image('bad/create', '1', craft({ config: withConfig({ User: 'nobody:../../etc' }) }));
    const startedMs = Date.now();
    const r = await api(cluster, token, 'POST', '/v1/sandboxes', { image: { ref: `${hostile.host}/bad/create:1` }, job: 'hostile-job' });
    expect(r.status, JSON.stringify(r.body)).toBe(400);
    expect(r.body.error.code).toBe('invalid_image');
    expect(Date.now() - startedMs).toBeLessThan(DEADLINE_MS);
    expect((await api(cluster, token, 'GET', '/v1/sandboxes')).status).toBe(200);
    expect((await api(cluster, token, 'POST', '/v1/jobs/hostile-job/pause', {})).status).toBe(200);
  }, 30_000);

  it('an 8 MB platform is refused at the request, and not echoed', async () => {
    const platform = `linux/${'a'.repeat(8_000_000)}`;
    for (const [route, body] of [['/v1/images/pull', { ref: `${hostile.host}/x/y:1`, platform }], ['/v1/sandboxes', { image: { ref: `${hostile.host}/x/y:1`, platform } }]] as const) {
      const r = await api(cluster, token, 'POST', route, body);
      expect(r.status).toBe(400);
      expect(r.body.error.code).toBe('invalid_request');
      expect(JSON.stringify(r.body).length).toBeLessThan(2000);
    }
  }, 30_000);
});

const challenge = (realm: string) => (_req: unknown, res: ServerResponse) => void res.writeHead(401, { 'www-authenticate': `Bearer realm="${realm}",service="hostile"` }).end();
const redirectTo = (location: string) => (_req: unknown, res: ServerResponse) => void res.writeHead(307, { location }).end();

describe('tokens and redirects are held to the egress policy', () => {
  afterEach(() => {
    helper.on('/v2/', undefined); // a plain registry again
    expect(outsider.requests).toEqual([]); // never reached, whatever a registry named
  });

  it('a token answer over its cap: registry_unavailable naming the cap', async () => {
    helper.on('/v2/', challenge(`http://${hostile.host}/token`));
    hostile.on('/token', (_req, res) => void res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ token: 'a'.repeat(1_500_000) })));
    await failsCoded('bad-token-size', `${helper.host}/t/x:1`, 'registry_unavailable', /token answer .* is larger than 1 MiB, the cap of its kind/);
  }, 30_000);

  for (const [what, realm, message] of [
    ['on a loopback port not listed internal', () => `http://${outsider.host}/token`, /not listed in ROLLBOX_REGISTRY_INTERNAL/],
    ['that is a file: URL', () => 'file:///etc/passwd', /only http and https/],
    ['on cloud metadata', () => 'http://169.254.169.254/latest/meta-data/', /169\.254\.169\.254 is a loopback, link-local or private address/],
  ] as const) {
    it(`a token realm ${what}: registry_not_allowed`, async () => {
      helper.on('/v2/', challenge(realm()));
      await failsCoded('bad-token-realm', `${helper.host}/t/x:1`, 'registry_not_allowed', message);
    }, 30_000);
  }

  it('redirects of an internal registry are followed to a loopback port listed internal too, and refused to one that is not', async () => {
    const image = craft({ config: (c) => ({ ...c, config: { ...c.config, Env: ['REDIRECTED=1'] } }), layers: [await freshLayer()] });
    const [config, layer] = image.blobs as [Buffer, Buffer];
    helper.blob('store', layer);
    hostile.image('r/ok', '1', { manifest: image.manifest, blobs: [config] });
    hostile.on(`/v2/r/ok/blobs/${digestOf(layer)}`, redirectTo(`http://${helper.host}/v2/store/blobs/${digestOf(layer)}`));
    const started = await startPull(cluster, token, { ref: `${hostile.host}/r/ok:1`, name: 'redirect-ok' });
    const ready = await pullEnded(cluster, token, 'redirect-ok', started.pull!.id, DEADLINE_MS + 5000);
    expect(ready, JSON.stringify(ready)).toMatchObject({ state: 'ready', config: { Env: ['REDIRECTED=1'] } });
    expect(helper.requests).toContain(`/v2/store/blobs/${digestOf(layer)}`);
    expect((await api(cluster, token, 'DELETE', '/v1/images/redirect-ok')).status).toBe(200);

    const other = craft({ layers: [await freshLayer()] });
    const [otherConfig, otherLayer] = other.blobs as [Buffer, Buffer];
    outsider.blob('store', otherLayer);
    hostile.image('r/no', '1', { manifest: other.manifest, blobs: [otherConfig] });
    hostile.on(`/v2/r/no/blobs/${digestOf(otherLayer)}`, redirectTo(`http://${outsider.host}/v2/store/blobs/${digestOf(otherLayer)}`));
    await failsCoded('redirect-no', `${hostile.host}/r/no:1`, 'registry_not_allowed', new RegExp(`a redirect of ${hostile.host}: ${outsider.host} is a loopback`));
  }, 60_000);

  const redisPort = () => new URL(cluster.redisUrl).port;
  for (const [what, target, message] of [
    ["the gateway's own API", () => `${cluster.url}/v1/images`, /is a loopback, link-local or private address/],
    ['Redis', () => `http://127.0.0.1:${redisPort()}/`, /is a loopback, link-local or private address/],
    ['localhost on port 0', () => 'http://localhost:0/v2/', /port 0 is not a port/],
    ['a file: URL', () => 'file:///etc/passwd', /only http and https are allowed, not file:/],
    ['a data: URL', () => 'data:text/plain,hello', /only http and https are allowed, not data:/],
    ['a gopher: URL at Redis', () => `gopher://127.0.0.1:${redisPort()}/_INFO`, /only http and https are allowed, not gopher:/],
    ['cloud metadata', () => 'http://169.254.169.254/latest/meta-data/', /is a loopback, link-local or private address/],
    ['a name that resolves to loopback', () => `http://localhost:${redisPort()}/`, /localhost:\d+ is a loopback/],
  ] as const) {
    it(`a redirect to ${what}: registry_not_allowed`, async () => {
      const repo = `r/to-${what.replace(/[^a-z]+/gi, '-').toLowerCase()}`.replace(/-$/, '');
      hostile.on(`/v2/${repo}/manifests/1`, redirectTo(target()));
      await failsCoded('redirected', `${hostile.host}/${repo}:1`, 'registry_not_allowed', message);
    }, 30_000);
  }

  it('a redirect loop ends after 5 hops, and a manifest past its cap is not read on', async () => {
    hostile.on('/v2/loop/a/manifests/1', redirectTo(`http://${hostile.host}/v2/loop/a/manifests/1`));
    await failsCoded('redirect-loop', `${hostile.host}/loop/a:1`, 'registry_unavailable', /more than 5 redirects/);
    let sent = 0;
    hostile.on('/v2/huge/manifest/manifests/1', (_req, res) => {
      res.writeHead(200, { 'content-type': MEDIA_TYPES.manifest });
      const piece = Buffer.alloc(1 << 20, 0x20);
      const pump = (): void => {
        while (sent < 64 << 20) {
          sent += piece.length;
          if (!res.write(piece)) return void res.once('drain', pump);
        }
        res.end();
      };
      pump();
    });
    await failsCoded('huge-manifest', `${hostile.host}/huge/manifest:1`, 'invalid_image', /larger than 4 MiB, the cap of its kind/);
    expect(sent).toBeLessThan(32 << 20); // cut off soon after the cap, not read to its end
  }, 30_000);

  it('quotes no foreign body, only the distribution spec\'s error codes', async () => {
    hostile.on('/v2/f/json/manifests/1', (_req, res) => void res.writeHead(500, { 'content-type': 'application/json' }).end(JSON.stringify({ errors: [{ code: 'MANIFEST_UNKNOWN', message: 'FOREIGN-TEXT' }, { code: 'FOREIGN-CODE' }], error: { code: 'unauthenticated', message: 'FOREIGN-TEXT' } })));
    hostile.on('/v2/f/text/manifests/1', (_req, res) => void res.writeHead(403, { 'content-type': 'text/html' }).end('<html>FOREIGN-TEXT</html>'));
    const json = await failsCoded('foreign-json', `${hostile.host}/f/json:1`, 'registry_unavailable', /answered 500 for .* \(MANIFEST_UNKNOWN\)$/);
    const text = await failsCoded('foreign-text', `${hostile.host}/f/text:1`, 'registry_unauthorized', /answered 403 for /);
    expect(JSON.stringify([json, text])).not.toMatch(/FOREIGN/);
  }, 30_000);

  it('refs naming a port outside 1-65535 are invalid_request, registries outside the allowlist registry_not_allowed, at the request', async () => {
    for (const ref of ['127.0.0.1:99999/x/y:1', 'localhost:0/x/y:1', 'localhost:65536/x/y:1']) {
      const r = await api(cluster, token, 'POST', '/v1/images/pull', { ref, name: 'bad-port' });
      expect(r.status, ref).toBe(400);
      expect(r.body.error).toMatchObject({ code: 'invalid_request', message: expect.stringMatching(/outside 1-65535/) });
    }
    const notListed = await api(cluster, token, 'POST', '/v1/images/pull', { ref: `127.0.0.1:${redisPort()}/x/y:1`, name: 'not-listed' });
    expect(notListed.status).toBe(403);
    expect(notListed.body.error).toMatchObject({ code: 'registry_not_allowed', message: expect.stringMatching(/not in ROLLBOX_REGISTRY_ALLOW/) });
    // Allowed by name, refused by what the name resolves to.
    await failsCoded('resolves-loopback', `localhost:${redisPort()}/x/y:1`, 'registry_not_allowed', /localhost:\d+ is a loopback/);
  }, 30_000);
});

describe('a registry that stalls or trickles fails within the deadline', () => {
  const manifestType = { 'content-type': MEDIA_TYPES.manifest };

  it('a manifest trickled a byte at a time: registry_unavailable, under the rate floor', async () => {
    hostile.on('/v2/slow/manifest/manifests/1', (_req, res) => {
      res.writeHead(200, { ...manifestType, 'content-length': 100_000 });
      trickle(res, Buffer.alloc(100_000, 0x20), 300);
    });
    await failsCoded('slow-manifest', `${hostile.host}/slow/manifest:1`, 'registry_unavailable', /under the floor of 2048 bytes\/s/);
  }, 30_000);

  it('a layer blob trickled a byte at a time: registry_unavailable, under the rate floor', async () => {
    const image = craft({ layers: [await freshLayer(100_000)] });
    hostile.image('slow/blob', '1', { manifest: image.manifest, blobs: [image.blobs[0]!] });
    hostile.on(`/v2/slow/blob/blobs/${digestOf(image.blobs[1]!)}`, (_req, res) => {
      res.writeHead(200, { 'content-length': image.blobs[1]!.length });
      trickle(res, image.blobs[1]!, 300);
    });
    await failsCoded('slow-blob', `${hostile.host}/slow/blob:1`, 'registry_unavailable', /blob sha256:[0-9a-f]+ from .*under the floor/);
  }, 30_000);

  it('headers trickled a byte at a time: registry_unavailable once the answer is late', async () => {
    hostile.on('/v2/slow/headers/manifests/1', (_req, res) => {
      res.socket!.write('HTTP/1.1 200 OK\r\n');
      trickle(res.socket!, Buffer.from(`x-slow: ${'a'.repeat(1000)}\r\n\r\n`), 300);
    });
    await failsCoded('slow-headers', `${hostile.host}/slow/headers:1`, 'registry_unavailable', /no answer for 3 s/);
  }, 30_000);

  it('a blob sent above the floor but for longer than the deadline: image_pull_timeout', async () => {
    const big = craft({ layers: [await freshLayer(400_000)] });
    hostile.image('slow/long', '1', { manifest: big.manifest, blobs: [big.blobs[0]!] });
    hostile.on(`/v2/slow/long/blobs/${digestOf(big.blobs[1]!)}`, (_req, res) => {
      res.writeHead(200, { 'content-length': big.blobs[1]!.length });
      let sent = 0;
      const timer = setInterval(() => {
        res.write(big.blobs[1]!.subarray(sent, (sent += 1024)));
        if (sent >= big.blobs[1]!.length) clearInterval(timer);
      }, 200); // 5 KiB/s: above the 2 KiB/s floor, 80 s in all
      res.once('close', () => clearInterval(timer));
    });
    await failsCoded('slow-long', `${hostile.host}/slow/long:1`, 'image_pull_timeout', /deadline of 8 s/);
  }, 30_000);
});

describe('records an older version stored under looser rules', () => {
  const upload = async () => {
    const r = await api(cluster, token, 'POST', '/v1/layers', new Uint8Array(await layerTar([{ name: `f-${randomBytes(6).toString('hex')}`, content: randomBytes(64) }])), { 'content-type': 'application/x-tar' });
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    return r.body.digest as string;
  };
  const gone = (digest: string) => waitFor(`layer ${digest} collected`, async () => (await api(cluster, token, 'GET', `/v1/layers/${digest}`)).status === 404, 20_000);

  // Stored under the tenant's own names (`<tenant>/<name>`), as this version keys them: what is old is the record's content.
  it('are left out of GET /v1/images, named coded, keep their layers from the janitor (which goes on), and can be deleted', async () => {
    const kept = await upload();
    const now = new Date().toISOString();
    await redis.hset(keys.images, 'hostile/legacy-v8', JSON.stringify({ name: 'legacy-v8', digest: kept, platform: 'linux/amd64/V8', layers: [{ digest: kept, diffId: kept, sizeBytes: 1.5 }], config: { Env: [] }, sizeBytes: 1e300, createdAt: now }));
    await redis.hset(keys.imagePulls, 'hostile/legacy-pull', JSON.stringify({ id: 'pull_x', ref: 'x/y:1', platform: 'linux/amd64', state: 'failed', startedAt: now, progress: { layersTotal: 1, layersDone: 0, layersReused: 0, bytesTotal: 1.5, bytesDone: 0, bytesFetched: 0 }, resumed: 0 }));
    const list = await api<{ images: ImageRecord[] }>(cluster, token, 'GET', '/v1/images');
    expect(list.status).toBe(200);
    expect(list.body.images.map((i) => i.name)).not.toContain('legacy-v8');
    expect(list.body.images.map((i) => i.name)).not.toContain('legacy-pull');
    const named = await api(cluster, token, 'GET', '/v1/images/legacy-v8');
    expect(named.status).toBe(400);
    expect(named.body.error).toMatchObject({ code: 'invalid_image', message: expect.stringMatching(/stored record is invalid .*platform.*DELETE \/v1\/images\/legacy-v8 removes it/) });

    // The janitor sweeps on: a layer nothing references goes; the one the invalid record names stays.
    await gone(await upload());
    expect((await api(cluster, token, 'GET', `/v1/layers/${kept}`)).status).toBe(200);

    const deleted = await api(cluster, token, 'DELETE', '/v1/images/legacy-v8');
    expect(deleted.status, JSON.stringify(deleted.body)).toBe(200);
    expect(deleted.body).toMatchObject({ name: 'legacy-v8', error: { code: 'invalid_image' } });
    expect((await api(cluster, token, 'DELETE', '/v1/images/legacy-pull')).status).toBe(200);
    expect(await redis.hexists(keys.images, 'hostile/legacy-v8')).toBe(0);
    expect(await redis.hexists(keys.imagePulls, 'hostile/legacy-pull')).toBe(0);
    await gone(kept);
  }, 60_000);

  it('a sandbox whose spec an image config poisoned is read, listed, paused by job and deleted', async () => {
    const created = await api(cluster, token, 'POST', '/v1/sandboxes', { job: 'legacy-job', resources: { memoryMiB: 64 } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const id = created.body.id as string;
    await redis.hset(keys.sandbox(id), 'spec', JSON.stringify({ ...created.body.spec, env: { A: 'x\u0000y', BIG: 'x'.repeat(40_000) }, workdir: '/a\u0000b', user: 'nobody:../../etc' }));
    const read = await api(cluster, token, 'GET', `/v1/sandboxes/${id}`);
    expect(read.status, JSON.stringify(read.body).slice(0, 500)).toBe(200);
    expect(read.body.spec.env).toEqual({});
    const listed = await api(cluster, token, 'GET', '/v1/sandboxes?job=legacy-job');
    expect(listed.status).toBe(200);
    expect(listed.body.sandboxes.map((s: { id: string }) => s.id)).toEqual([id]);
    const paused = await api(cluster, token, 'POST', '/v1/jobs/legacy-job/pause', {});
    expect(paused.status, JSON.stringify(paused.body)).toBe(200);
    expect(paused.body.results).toMatchObject([{ id, outcome: 'done', state: 'paused' }]);
    expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)).status).toBe(200);
  }, 60_000);
});
