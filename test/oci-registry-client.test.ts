import { createHash } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RegistryRepository, parseReference, type RegistryOptions } from '../src/oci-registry/index.ts';

/**
 * The registry client against a registry played by a loopback HTTP server, for what Debian's
 * docker-registry cannot be made to do on demand: a token that ends and must be renewed, a
 * token the registry stops honouring (the retry after a 401), a blob redirected to another
 * host (which must not see the credentials), a registry naming a manifest by another digest.
 * The real registry's behaviour is tested in pull.test.ts and pull-registries.test.ts.
 */

interface Seen {
  host: string;
  path: string;
  authorization?: string;
}

const seen: Seen[] = [];
const manifest = Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json', config: { digest: 'sha256:x', size: 1 }, layers: [] }));
const blob = Buffer.from('layer bytes');
const big = Buffer.alloc(4 << 20, 7);
const stalled = Buffer.alloc(100_000, 9);
const sha = (b: Buffer): string => `sha256:${createHash('sha256').update(b).digest('hex')}`;
let tokensIssued = 0;
/** Tokens the registry takes (one is struck off to force a 401). */
const valid = new Set<string>();
let lieAboutDigest = false;
let registry: http.Server;
let storage: http.Server;
let registryHost: string;
let storageHost: string;

function listen(handler: http.RequestListener): Promise<{ server: http.Server; host: string }> {
  const server = http.createServer(handler);
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ server, host: `127.0.0.1:${(server.address() as AddressInfo).port}` })));
}

beforeAll(async () => {
  ({ server: storage, host: storageHost } = await listen((req, res) => {
    seen.push({ host: storageHost, path: req.url ?? '', ...(req.headers.authorization ? { authorization: req.headers.authorization } : {}) });
    res.writeHead(200, { 'content-length': blob.length }).end(blob);
  }));
  ({ server: registry, host: registryHost } = await listen((req, res) => {
    const url = new URL(req.url ?? '/', `http://${registryHost}`);
    seen.push({ host: registryHost, path: url.pathname, ...(req.headers.authorization ? { authorization: req.headers.authorization } : {}) });
    if (url.pathname === '/token') {
      const expected = `Basic ${Buffer.from('u:p').toString('base64')}`;
      if (req.headers.authorization !== expected) return void res.writeHead(401).end();
      const token = `t${++tokensIssued}`;
      valid.add(token);
      return void res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ access_token: token, expires_in: 120 }));
    }
    const bearer = /^Bearer (.+)$/.exec(req.headers.authorization ?? '')?.[1];
    if (!bearer || !valid.has(bearer)) {
      return void res.writeHead(401, { 'www-authenticate': `Bearer realm="http://${registryHost}/token",service="fake",scope="repository:team/app:pull"` }).end('{"errors":[{"code":"UNAUTHORIZED"}]}');
    }
    if (url.pathname === '/v2/') return void res.writeHead(200).end('{}');
    if (url.pathname === '/v2/team/app/manifests/1') {
      return void res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json', 'docker-content-digest': lieAboutDigest ? sha(Buffer.from('other')) : sha(manifest) }).end(manifest);
    }
    if (url.pathname === `/v2/team/app/blobs/${sha(blob)}`) return void res.writeHead(307, { location: `http://${storageHost}/signed/blob?sig=abc` }).end();
    if (url.pathname === `/v2/team/app/blobs/${sha(big)}`) return void res.writeHead(200, { 'content-length': big.length }).end(big);
    if (url.pathname === `/v2/team/app/blobs/${sha(stalled)}`) {
      res.writeHead(200, { 'content-length': stalled.length });
      res.write(stalled.subarray(0, 1000)); // then nothing
      return;
    }
    res.writeHead(404).end('{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}');
  }));
});
afterAll(async () => {
  await Promise.all([registry, storage].map((s) => new Promise((r) => s?.close(r))));
});

function options(now: () => number): RegistryOptions {
  return { credentials: new Map([[registryHost, { username: 'u', password: 'p' }]]), insecure: new Set([registryHost]), mirrors: new Map(), timeoutMs: 5000, now, egress: { allowed: new Set(), internal: new Set([registryHost, storageHost]) }, rateFloor: { minBytesPerSecond: 0, windowMs: 1000 } };
}

describe('RegistryRepository', () => {
  it('gets a token from the realm with the credentials, renews it as it nears its end, and fetches a new one once after a 401', async () => {
    let nowMs = 1_000_000;
    const repo = new RegistryRepository(parseReference(`${registryHost}/team/app:1`), options(() => nowMs));
    expect((await repo.manifest()).digest).toBe(sha(manifest));
    expect(tokensIssued).toBe(1);
    expect(seen.filter((s) => s.path === '/v2/team/app/manifests/1').at(-1)!.authorization).toBe('Bearer t1');

    nowMs += 115_000; // 5 s before its end: renewed first
    await repo.manifest();
    expect(tokensIssued).toBe(2);
    expect(seen.filter((s) => s.path === '/v2/team/app/manifests/1').at(-1)!.authorization).toBe('Bearer t2');

    valid.delete('t2'); // the registry stops honouring it: one 401, a new token, the request again
    await repo.manifest();
    expect(tokensIssued).toBe(3);
    expect(seen.filter((s) => s.path === '/v2/team/app/manifests/1').slice(-2).map((s) => s.authorization)).toEqual(['Bearer t2', 'Bearer t3']);
  });

  it('follows a redirect to another host without sending it the credentials', async () => {
    const repo = new RegistryRepository(parseReference(`${registryHost}/team/app:1`), options(Date.now));
    expect(await repo.blob(sha(blob), 1024)).toEqual(blob);
    const atStorage = seen.filter((s) => s.host === storageHost);
    expect(atStorage.at(-1)).toEqual({ host: storageHost, path: '/signed/blob?sig=abc' });
    await expect(repo.blob(sha(Buffer.from('missing')), 1024)).rejects.toMatchObject({ code: 'invalid_image', message: expect.stringMatching(/404.*BLOB_UNKNOWN/) });
  });

  it('refuses a manifest the registry names by another digest, and wrong credentials', async () => {
    lieAboutDigest = true;
    try {
      const repo = new RegistryRepository(parseReference(`${registryHost}/team/app:1`), options(Date.now));
      await expect(repo.manifest()).rejects.toMatchObject({ code: 'invalid_image', message: expect.stringMatching(/the registry names it sha256:\w+, its bytes hash to/) });
    } finally {
      lieAboutDigest = false;
    }
    const wrong = new RegistryRepository(parseReference(`${registryHost}/team/app:1`), { ...options(Date.now), credentials: new Map([[registryHost, { username: 'u', password: 'nope' }]]) });
    const err = await wrong.manifest().then(() => undefined, (e: unknown) => e as Error & { code: string });
    expect(err).toMatchObject({ code: 'registry_unauthorized' });
    expect(err!.message).not.toContain('nope');
    expect(err!.message).toMatch(/refused the configured credentials/);
  });

  it('times a blob out only while its reader waits for bytes: a reader busy elsewhere is not cut off, a registry that stalls is', async () => {
    const repo = new RegistryRepository(parseReference(`${registryHost}/team/app:1`), { ...options(Date.now), timeoutMs: 300 });
    const stream = await repo.blobStream(sha(big), big.length);
    await new Promise((r) => setTimeout(r, 1000)); // the reader is busy (a layer waiting for an extraction thread)
    const chunks: Buffer[] = [];
    for await (const c of stream as AsyncIterable<Buffer>) chunks.push(c);
    expect(Buffer.concat(chunks).equals(big)).toBe(true);

    const stalling = await repo.blobStream(sha(stalled), stalled.length);
    const startedAt = Date.now();
    const read = (async () => {
      for await (const c of stalling as AsyncIterable<Buffer>) void c;
    })();
    await expect(read).rejects.toMatchObject({ code: 'registry_unavailable', message: expect.stringMatching(/sent nothing for 0.3 s \(1000 of 100000 bytes\)/) });
    expect(Date.now() - startedAt).toBeLessThan(3000);
  });
});
