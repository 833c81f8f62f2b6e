import { createServer, type Server } from 'node:http';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { SignJWT, exportJWK, exportPKCS8, exportSPKI, generateKeyPair, type CryptoKey, type JWTPayload } from 'jose';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { RollboxError, type ErrorCode } from '../api/index.ts';
import type { Config } from '../config/index.ts';
import {
  createTokenIssuer,
  createTokenVerifier,
  loadOrCreateHsSecret,
  requireScope,
  type JwtConfig,
  type Principal,
} from './index.ts';

// The config module's `jwt` slice must be accepted as is.
const fromConfig = (c: Config['jwt']): JwtConfig => c;
void fromConfig;

const T0 = 1_800_000_000_000; // ms; a fixed clock so expiry tests are exact
const T0s = T0 / 1000;
const now = (ms = T0) => () => ms;

let dir: string;
let hs: JwtConfig;
beforeEach(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'rollbox-iam-verify-'));
  hs = { alg: 'HS256', secretFile: path.join(dir, 'jwt-secret'), issuer: 'rollbox', audience: 'rollbox-api', clockToleranceSec: 5 };
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const bearer = (token: string) => `Bearer ${token}`;
const b64 = (value: object) => Buffer.from(JSON.stringify(value)).toString('base64url');

/** Signs arbitrary claims with the deployment's HS256 secret (bypasses the issuer's checks). */
async function signHs(claims: JWTPayload, opts: { omit?: string[] } = {}): Promise<string> {
  const secret = await loadOrCreateHsSecret(hs.secretFile);
  const payload: JWTPayload = { iss: 'rollbox', aud: 'rollbox-api', iat: T0s, exp: T0s + 600, tenant: 'acme', scopes: ['sandbox:read'], ...claims };
  for (const k of opts.omit ?? []) delete payload[k];
  return new SignJWT(payload).setProtectedHeader({ alg: 'HS256' }).sign(secret);
}

async function rejection(p: Promise<unknown>): Promise<RollboxError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(RollboxError);
  return err as RollboxError;
}

async function expectRejected(p: Promise<unknown>, code: ErrorCode, message: RegExp): Promise<void> {
  const err = await rejection(p);
  expect(err.code).toBe(code);
  expect(err.message).toMatch(message);
}

async function edKeys(alg: 'EdDSA' | 'ES256' = 'EdDSA') {
  const { publicKey, privateKey } = await generateKeyPair(alg, { extractable: true });
  const publicKeyFile = path.join(dir, `${alg}.pub.pem`);
  const privateKeyFile = path.join(dir, `${alg}.key.pem`);
  const publicPem = await exportSPKI(publicKey);
  await writeFile(publicKeyFile, publicPem);
  await writeFile(privateKeyFile, await exportPKCS8(privateKey));
  return { publicKey, privateKey, publicKeyFile, privateKeyFile, publicPem };
}

describe('createTokenVerifier (HS256)', () => {
  it('accepts a valid token and builds the principal', async () => {
    const token = await createTokenIssuer(hs, { now: now() }).issue({ tenant: 'acme', scopes: ['sandbox:create', 'sandbox:exec'], ttlSeconds: 3600, subject: 'trainer-7' });
    const p = await createTokenVerifier(hs, { now: now() }).verify(bearer(token));
    expect(p.tenant).toBe('acme');
    expect([...p.scopes].sort()).toEqual(['sandbox:create', 'sandbox:exec']);
    expect(p.subject).toBe('trainer-7');
    expect(p.tokenId).toMatch(/^[0-9a-f-]{36}$/);
    expect(Object.isFrozen(p)).toBe(true);
  });

  it('accepts a lower-case scheme and a space-separated scopes claim, ignoring unknown scopes', async () => {
    const token = await signHs({ scopes: 'sandbox:read  future:thing layer:read' });
    const p = await createTokenVerifier(hs, { now: now() }).verify(`bearer ${token}`);
    expect([...p.scopes].sort()).toEqual(['layer:read', 'sandbox:read']);
  });

  it('rejects a missing or empty Authorization header', async () => {
    const v = createTokenVerifier(hs, { now: now() });
    await expectRejected(v.verify(undefined), 'unauthenticated', /missing Authorization header/);
    await expectRejected(v.verify('  '), 'unauthenticated', /missing Authorization header/);
  });

  it('rejects garbage', async () => {
    const v = createTokenVerifier(hs, { now: now() });
    await expectRejected(v.verify('Basic dXNlcjpwYXNz'), 'unauthenticated', /malformed Authorization header/);
    await expectRejected(v.verify('Bearer'), 'unauthenticated', /malformed Authorization header/);
    await expectRejected(v.verify('Bearer not-a-jwt'), 'unauthenticated', /malformed token/);
    await expectRejected(v.verify('Bearer a.b.c'), 'unauthenticated', /malformed token/);
    await expectRejected(v.verify(`Bearer ${'a'.repeat(20_000)}`), 'unauthenticated', /too long/);
  });

  it('rejects a tampered payload', async () => {
    const [h, , s] = (await signHs({})).split('.');
    const forged = `${h}.${b64({ iss: 'rollbox', aud: 'rollbox-api', exp: T0s + 600, tenant: 'acme', scopes: ['admin'] })}.${s}`;
    await expectRejected(createTokenVerifier(hs, { now: now() }).verify(bearer(forged)), 'unauthenticated', /signature invalid/);
  });

  it('rejects alg "none"', async () => {
    const claims = { iss: 'rollbox', aud: 'rollbox-api', exp: T0s + 600, tenant: 'acme', scopes: ['admin'] };
    const unsigned = `${b64({ alg: 'none', typ: 'JWT' })}.${b64(claims)}.`;
    const v = createTokenVerifier(hs, { now: now() });
    await expectRejected(v.verify(bearer(unsigned)), 'unauthenticated', /algorithm not accepted/);
    // Same with a junk "signature" attached.
    await expectRejected(v.verify(bearer(`${unsigned}AAAA`)), 'unauthenticated', /algorithm not accepted/);
  });

  it('rejects an EdDSA-signed token when configured for HS256', async () => {
    const { privateKey } = await edKeys();
    const token = await new SignJWT({ tenant: 'acme', scopes: ['admin'] })
      .setProtectedHeader({ alg: 'EdDSA' })
      .setIssuer('rollbox')
      .setAudience('rollbox-api')
      .setExpirationTime(T0s + 600)
      .sign(privateKey);
    await expectRejected(createTokenVerifier(hs, { now: now() }).verify(bearer(token)), 'unauthenticated', /algorithm not accepted \(this server accepts HS256 only\)/);
  });

  it('rejects a wrong issuer and a wrong audience', async () => {
    const v = createTokenVerifier(hs, { now: now() });
    await expectRejected(v.verify(bearer(await signHs({ iss: 'someone-else' }))), 'unauthenticated', /issuer not accepted/);
    await expectRejected(v.verify(bearer(await signHs({ aud: 'other-api' }))), 'unauthenticated', /audience not accepted/);
    await expectRejected(v.verify(bearer(await signHs({ aud: ['other-api', 'third'] }))), 'unauthenticated', /audience not accepted/);
    // An audience array containing ours is fine.
    await expect(v.verify(bearer(await signHs({ aud: ['other-api', 'rollbox-api'] })))).resolves.toMatchObject({ tenant: 'acme' });
  });

  it('requires iss, aud and exp', async () => {
    const v = createTokenVerifier(hs, { now: now() });
    for (const claim of ['iss', 'aud', 'exp']) {
      await expectRejected(v.verify(bearer(await signHs({}, { omit: [claim] }))), 'unauthenticated', new RegExp(`lacks the required "${claim}" claim`));
    }
  });

  it('rejects a token expired beyond the clock tolerance and accepts one within it', async () => {
    const token = await signHs({ exp: T0s + 60 });
    await expectRejected(createTokenVerifier(hs, { now: now(T0 + 66_000) }).verify(bearer(token)), 'unauthenticated', /^token expired$/);
    await expect(createTokenVerifier(hs, { now: now(T0 + 64_000) }).verify(bearer(token))).resolves.toMatchObject({ tenant: 'acme' });
  });

  it('rejects a token that is not yet valid', async () => {
    const token = await signHs({ nbf: T0s + 60 });
    await expectRejected(createTokenVerifier(hs, { now: now() }).verify(bearer(token)), 'unauthenticated', /not yet valid/);
  });

  it('rejects a missing, invalid or mistyped tenant and a mistyped scopes claim', async () => {
    const v = createTokenVerifier(hs, { now: now() });
    await expectRejected(v.verify(bearer(await signHs({}, { omit: ['tenant'] }))), 'unauthenticated', /no tenant claim/);
    await expectRejected(v.verify(bearer(await signHs({ tenant: 'a/b' }))), 'unauthenticated', /tenant claim is invalid/);
    await expectRejected(v.verify(bearer(await signHs({ tenant: 'x'.repeat(65) }))), 'unauthenticated', /tenant claim is invalid/);
    await expectRejected(v.verify(bearer(await signHs({ tenant: 42 }))), 'unauthenticated', /tenant claim is invalid/);
    await expectRejected(v.verify(bearer(await signHs({ scopes: { admin: true } }))), 'unauthenticated', /scopes claim must be/);
  });

  it('does not leak the secret or the token in error messages', async () => {
    const secret = new TextDecoder().decode(await loadOrCreateHsSecret(hs.secretFile));
    const token = await signHs({ iss: 'evil' });
    const err = await rejection(createTokenVerifier(hs, { now: now() }).verify(bearer(token)));
    expect(err.message).not.toContain(secret);
    expect(err.message).not.toContain(token.split('.')[2]);
  });
});

describe('verified-token cache', () => {
  it('returns the same principal without re-verifying, but still rejects after exp', async () => {
    let clock = T0;
    const v = createTokenVerifier(hs, { now: () => clock });
    const token = await signHs({ exp: T0s + 30 });
    const first = await v.verify(bearer(token));
    clock = T0 + 20_000;
    expect(await v.verify(bearer(token))).toBe(first); // identity: served from the cache
    clock = T0 + 36_000; // past exp + 5 s tolerance
    await expectRejected(v.verify(bearer(token)), 'unauthenticated', /token expired/);
  });

  it('re-verifies after the cache TTL and evicts the least recently used entry', async () => {
    let clock = T0;
    const v = createTokenVerifier(hs, { now: () => clock, cacheTtlMs: 1000, cacheMaxEntries: 2 });
    const [a, b, c] = await Promise.all(['a', 'b', 'c'].map((tenant) => signHs({ tenant })));
    const pa = await v.verify(bearer(a!));
    clock = T0 + 1500;
    const pa2 = await v.verify(bearer(a!));
    expect(pa2).not.toBe(pa);
    expect(pa2).toEqual(pa);

    const pb = await v.verify(bearer(b!));
    expect(await v.verify(bearer(a!))).toBe(pa2); // touch a: b is now the oldest
    await v.verify(bearer(c!)); // evicts b
    expect(await v.verify(bearer(a!))).toBe(pa2);
    expect(await v.verify(bearer(b!))).not.toBe(pb);
  });

  it('never caches rejected tokens', async () => {
    const v = createTokenVerifier(hs, { now: now() });
    const bad = await signHs({ iss: 'evil' });
    await expectRejected(v.verify(bearer(bad)), 'unauthenticated', /issuer/);
    await expectRejected(v.verify(bearer(bad)), 'unauthenticated', /issuer/);
  });
});

describe('createTokenVerifier (asymmetric)', () => {
  it('accepts EdDSA and ES256 tokens checked against a PEM public key file', async () => {
    for (const alg of ['EdDSA', 'ES256'] as const) {
      const keys = await edKeys(alg);
      const cfg: JwtConfig = { ...hs, alg, publicKeyFile: keys.publicKeyFile };
      const token = await createTokenIssuer({ ...cfg, privateKeyFile: keys.privateKeyFile }, { now: now() }).issue({ tenant: 'acme', scopes: ['layer:write'], ttlSeconds: 60 });
      const p = await createTokenVerifier(cfg, { now: now() }).verify(bearer(token));
      expect([...p.scopes]).toEqual(['layer:write']);
    }
  });

  it('rejects an HS256 token whose HMAC key is the server public key PEM (algorithm confusion)', async () => {
    const { publicKeyFile, publicPem } = await edKeys();
    const cfg: JwtConfig = { ...hs, alg: 'EdDSA', publicKeyFile };
    const forged = await new SignJWT({ tenant: 'acme', scopes: ['admin'] })
      .setProtectedHeader({ alg: 'HS256' })
      .setIssuer('rollbox')
      .setAudience('rollbox-api')
      .setExpirationTime(T0s + 600)
      .sign(new TextEncoder().encode(publicPem));
    await expectRejected(createTokenVerifier(cfg, { now: now() }).verify(bearer(forged)), 'unauthenticated', /algorithm not accepted \(this server accepts EdDSA only\)/);
  });

  it('rejects a token signed by another EdDSA key', async () => {
    const { publicKeyFile } = await edKeys();
    const other = await generateKeyPair('EdDSA');
    const token = await new SignJWT({ tenant: 'acme' })
      .setProtectedHeader({ alg: 'EdDSA' })
      .setIssuer('rollbox')
      .setAudience('rollbox-api')
      .setExpirationTime(T0s + 600)
      .sign(other.privateKey);
    await expectRejected(createTokenVerifier({ ...hs, alg: 'EdDSA', publicKeyFile }, { now: now() }).verify(bearer(token)), 'unauthenticated', /signature invalid/);
  });

  it('refuses ambiguous or missing asymmetric key configuration up front', () => {
    expect(() => createTokenVerifier({ ...hs, alg: 'EdDSA' })).toThrow(/needs publicKeyFile or jwksUrl/);
    expect(() => createTokenVerifier({ ...hs, alg: 'ES256', publicKeyFile: '/x.pem', jwksUrl: 'http://127.0.0.1:1/jwks' })).toThrow(/not both/);
  });

  it('fails ready() on an unreadable key file and recovers once the file appears', async () => {
    const keys = await edKeys();
    const publicKeyFile = path.join(dir, 'later.pem');
    const v = createTokenVerifier({ ...hs, alg: 'EdDSA', publicKeyFile }, { now: now() });
    await expect(v.ready()).rejects.toThrow(/ENOENT/);
    await writeFile(publicKeyFile, keys.publicPem);
    await expect(v.ready()).resolves.toBeUndefined();
  });
});

describe('createTokenVerifier (JWKS URL, loopback server)', () => {
  let server: Server | undefined;
  afterEach(async () => {
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
    server = undefined;
  });

  async function serveJwks(publicKey: CryptoKey): Promise<string> {
    const jwk = { ...(await exportJWK(publicKey)), kid: 'k1', alg: 'EdDSA', use: 'sig' };
    server = createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ keys: [jwk] }));
    });
    await new Promise<void>((resolve) => server!.listen(0, '127.0.0.1', resolve));
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}/.well-known/jwks.json`;
  }

  async function edToken(privateKey: CryptoKey, kid: string): Promise<string> {
    return new SignJWT({ tenant: 'acme', scope: 'sandbox:exec' })
      .setProtectedHeader({ alg: 'EdDSA', kid })
      .setIssuer('rollbox')
      .setAudience('rollbox-api')
      .setExpirationTime(T0s + 600)
      .sign(privateKey);
  }

  it('verifies with a key from the key set and rejects an unknown kid', async () => {
    const { publicKey, privateKey } = await generateKeyPair('EdDSA', { extractable: true });
    const jwksUrl = await serveJwks(publicKey);
    const v = createTokenVerifier({ ...hs, alg: 'EdDSA', jwksUrl }, { now: now() });
    const p = await v.verify(bearer(await edToken(privateKey, 'k1')));
    expect([...p.scopes]).toEqual(['sandbox:exec']); // OAuth-style `scope` claim
    await expectRejected(v.verify(bearer(await edToken(privateKey, 'k2'))), 'unauthenticated', /no unique key/);
  });

  it('reports an unreachable key set as unavailable, not as the caller’s fault', async () => {
    const { publicKey, privateKey } = await generateKeyPair('EdDSA', { extractable: true });
    const jwksUrl = await serveJwks(publicKey);
    await new Promise<void>((resolve) => server!.close(() => resolve()));
    server = undefined;
    const v = createTokenVerifier({ ...hs, alg: 'EdDSA', jwksUrl }, { now: now() });
    const err = await rejection(v.verify(bearer(await edToken(privateKey, 'k1'))));
    expect(err.code).toBe('unavailable');
    expect(err.retryAfterSeconds).toBe(5);
  });
});

describe('requireScope', () => {
  const principal = (...scopes: Principal['scopes'] extends ReadonlySet<infer S> ? S[] : never): Principal => ({ tenant: 'acme', scopes: new Set(scopes) });

  it('passes with the scope, throws forbidden without it', () => {
    expect(() => requireScope(principal('sandbox:exec'), 'sandbox:exec')).not.toThrow();
    let err: unknown;
    try {
      requireScope(principal('sandbox:read'), 'sandbox:delete');
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(RollboxError);
    expect((err as RollboxError).code).toBe('forbidden');
    expect((err as RollboxError).message).toBe('missing scope sandbox:delete');
  });

  it('lets admin through every scope', () => {
    expect(() => requireScope(principal('admin'), 'burst:admin')).not.toThrow();
    expect(() => requireScope(principal('admin'), 'sandbox:delete')).not.toThrow();
  });

  it('works end to end with a verified token', async () => {
    const p = await createTokenVerifier(hs, { now: now() }).verify(bearer(await signHs({ scopes: ['sandbox:read'] })));
    expect(() => requireScope(p, 'sandbox:read')).not.toThrow();
    expect(() => requireScope(p, 'sandbox:create')).toThrow(/missing scope sandbox:create/);
  });
});
