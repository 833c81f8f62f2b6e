import { generateKeyPairSync } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, startTestCluster, type TestCluster } from './support/cluster.ts';

let cluster: TestCluster;
let token: string;
let secret: Uint8Array;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-s' }], env: { ROLLBOX_BODY_LIMIT_BYTES: '65536', ROLLBOX_TENANT_MAX_SANDBOXES: '3' } });
  token = await cluster.token('tenant-a', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
  secret = new TextEncoder().encode(fs.readFileSync(cluster.config.jwt.secretFile, 'utf8').trim());
});
afterAll(async () => cluster?.stop());

const b64 = (value: object) => Buffer.from(JSON.stringify(value)).toString('base64url');
const claims = { tenant: 'tenant-a', scopes: ['admin'] };

async function signed(overrides: { alg?: string; iss?: string; aud?: string; expSec?: number; payload?: object; key?: Uint8Array }) {
  const now = Math.floor(Date.now() / 1000);
  return new SignJWT({ ...claims, ...overrides.payload })
    .setProtectedHeader({ alg: overrides.alg ?? 'HS256' })
    .setIssuer(overrides.iss ?? cluster.config.jwt.issuer)
    .setAudience(overrides.aud ?? cluster.config.jwt.audience)
    .setIssuedAt(now - 10)
    .setExpirationTime(overrides.expSec ?? now + 600)
    .sign(overrides.key ?? secret);
}

describe('authentication', () => {
  it('accepts a valid token and refuses forged ones with 401', async () => {
    expect((await api(cluster, await signed({}), 'GET', '/v1/sandboxes')).status).toBe(200);
    const now = Math.floor(Date.now() / 1000);
    const { publicKey, privateKey } = generateKeyPairSync('ed25519');
    const publicPem = publicKey.export({ type: 'spki', format: 'pem' }).toString();
    const forged = [
      undefined,
      'not-a-jwt',
      `${b64({ alg: 'none', typ: 'JWT' })}.${b64({ ...claims, iss: cluster.config.jwt.issuer, aud: cluster.config.jwt.audience, exp: now + 600 })}.`,
      await signed({ iss: 'someone-else' }),
      await signed({ aud: 'another-api' }),
      await signed({ expSec: now - 120 }),
      await signed({ key: new TextEncoder().encode('a-different-secret-of-enough-length-000') }),
      // Algorithm confusion: an asymmetric token, and an HMAC keyed with a public key.
      await new SignJWT(claims).setProtectedHeader({ alg: 'EdDSA' }).setIssuer(cluster.config.jwt.issuer).setAudience(cluster.config.jwt.audience).setExpirationTime('10m').sign(privateKey),
      await signed({ alg: 'HS256', key: new TextEncoder().encode(publicPem) }),
      await signed({ payload: { tenant: undefined } }),
    ];
    for (const bad of forged) {
      const response = await api(cluster, bad, 'GET', '/v1/sandboxes');
      expect(response.status, String(bad)).toBe(401);
      expect(response.body.error.code).toBe('unauthenticated');
    }
  });

  it('refuses a missing scope with 403', async () => {
    const readOnly = await cluster.token('tenant-a', ['sandbox:read']);
    const response = await api(cluster, readOnly, 'POST', '/v1/sandboxes', {});
    expect(response.status).toBe(403);
    expect(response.body.error.code).toBe('forbidden');
    expect((await api(cluster, readOnly, 'GET', '/v1/nodes')).status).toBe(403);
  });

  it("answers 404 for another tenant's sandbox", async () => {
    const created = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    expect(created.status).toBe(201);
    const other = await cluster.token('tenant-b', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
    for (const [method, suffix, body] of [['GET', ''], ['DELETE', ''], ['POST', '/exec', { argv: ['true'] }]] as const) {
      const response = await api(cluster, other, method, `/v1/sandboxes/${created.body.id}${suffix}`, body);
      expect(response.status).toBe(404);
      expect(response.body.error.code).toBe('not_found');
    }
    expect((await api(cluster, other, 'GET', '/v1/sandboxes')).body.sandboxes).toEqual([]);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${created.body.id}`);
  });
});

describe('quotas and idempotency', () => {
  it('refuses creates past the tenant quota with 429 and Retry-After', async () => {
    const quotaToken = await cluster.token('tenant-q', ['sandbox:create', 'sandbox:delete']);
    const created = await Promise.all([1, 2, 3].map(() => api(cluster, quotaToken, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 32 } })));
    expect(created.map((r) => r.status)).toEqual([201, 201, 201]);
    const over = await api(cluster, quotaToken, 'POST', '/v1/sandboxes', {});
    expect(over.status).toBe(429);
    expect(over.body.error.code).toBe('quota_exceeded');
    expect(Number(over.headers.get('retry-after'))).toBeGreaterThan(0);
    await api(cluster, quotaToken, 'DELETE', `/v1/sandboxes/${created[0]!.body.id}`);
    const again = await api(cluster, quotaToken, 'POST', '/v1/sandboxes', {});
    expect(again.status).toBe(201);
    await Promise.all([...created.slice(1), again].map((r) => api(cluster, quotaToken, 'DELETE', `/v1/sandboxes/${r.body.id}`)));
  });

  it('gives the same sandbox, created once, for one Idempotency-Key, also for concurrent requests', async () => {
    const key = { 'idempotency-key': `key-${Date.now()}` };
    const responses = await Promise.all([1, 2, 3].map(() => api(cluster, token, 'POST', '/v1/sandboxes', { labels: { idem: key['idempotency-key'] } }, key)));
    const ids = new Set(responses.map((r) => r.body.id));
    expect(ids.size).toBe(1);
    expect(responses.map((r) => r.status).sort()).toEqual([200, 200, 201]);
    const listed = await api(cluster, token, 'GET', `/v1/sandboxes?label=idem=${key['idempotency-key']}`);
    expect(listed.body.sandboxes).toHaveLength(1);
    const reused = await api(cluster, token, 'POST', '/v1/sandboxes', { labels: { other: 'body' } }, key);
    expect(reused.status).toBe(409);
    expect(reused.body.error.code).toBe('conflict');
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${[...ids][0]}`);
  });
});

describe('bad input', () => {
  it('names the field and carries a code', async () => {
    const cases: [object | string, string][] = [
      [{ unknownField: 1 }, 'unknownField'],
      [{ resources: { memoryMiB: 'lots' } }, 'resources.memoryMiB'],
      [{ resources: { memoryMiB: 10_000_000 } }, 'resources.memoryMiB'],
      [{ class: 'vip' }, 'class'],
      [{ workdir: 'relative' }, 'workdir'],
      ['{not json', ''],
    ];
    for (const [body, field] of cases) {
      const response = await api(cluster, token, 'POST', '/v1/sandboxes', body);
      expect(response.status, JSON.stringify(body)).toBe(400);
      expect(response.body.error.code).toBe('invalid_request');
      expect(response.body.error.message).toContain(field);
    }
    const exec = await api(cluster, token, 'POST', '/v1/sandboxes/sbx_x/exec', { argv: ['a'], cmd: 'b' });
    expect(exec.status).toBe(400);
  });

  it('refuses huge bodies with 413 before any handler', async () => {
    const huge = JSON.stringify({ env: { BIG: 'x'.repeat(200_000) } });
    const response = await api(cluster, token, 'POST', '/v1/sandboxes', huge);
    expect(response.status).toBe(413);
    expect(response.body.error.code).toBe('payload_too_large');
  });

  it('refuses unknown layers and unknown routes with 404 and a code', async () => {
    const response = await api(cluster, token, 'POST', '/v1/sandboxes', { image: { base: 'no-such-layer' } });
    expect(response.status).toBe(404);
    expect(response.body.error.message).toContain('no-such-layer');
    expect((await api(cluster, token, 'GET', '/v1/nowhere')).body.error.code).toBe('not_found');
  });

  it('serves an OpenAPI document generated from the schemas', async () => {
    const doc = await api(cluster, undefined, 'GET', '/openapi.json');
    expect(doc.status).toBe(200);
    expect(Object.keys(doc.body.paths)).toEqual(expect.arrayContaining(['/v1/sandboxes', '/v1/sandboxes/{id}/exec']));
    expect((await api(cluster, undefined, 'GET', '/healthz')).status).toBe(200);
    expect((await api(cluster, undefined, 'GET', '/readyz')).body.ready).toBe(true);
    const metrics = await api(cluster, undefined, 'GET', '/metrics');
    expect(metrics.body).toContain('rollbox_sandbox_creates_total{outcome="running"}');
    expect(metrics.body).toContain('rollbox_http_request_duration_seconds_bucket');
    expect(path.isAbsolute(cluster.rootDir)).toBe(true);
  });
});
