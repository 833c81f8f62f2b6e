import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { decodeJwt, decodeProtectedHeader } from 'jose';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { RollboxError, SCOPES } from '../api/index.ts';
import { createTokenIssuer, createTokenVerifier, issueTokenCommand, type JwtConfig } from './index.ts';

const T0 = 1_800_000_000_000;
let dir: string;
let hs: JwtConfig;
beforeEach(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'rollbox-iam-issue-'));
  hs = { alg: 'HS256', secretFile: path.join(dir, 'data', 'jwt-secret'), issuer: 'rollbox', audience: 'rollbox-api', clockToleranceSec: 5 };
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('issueTokenCommand', () => {
  it('issues a token the verifier accepts, with the expected claims', async () => {
    const token = await issueTokenCommand({ jwtConfig: hs, tenant: 'team.rl-1', scopes: ['sandbox:create,sandbox:exec', 'sandbox:read'], ttl: '1h', now: () => T0 });
    expect(token).toMatch(/^[\w-]+\.[\w-]+\.[\w-]+$/);
    expect(decodeProtectedHeader(token)).toEqual({ alg: 'HS256', typ: 'JWT' });
    const claims = decodeJwt(token);
    expect(claims).toMatchObject({ iss: 'rollbox', aud: 'rollbox-api', iat: T0 / 1000, exp: T0 / 1000 + 3600, tenant: 'team.rl-1', scopes: ['sandbox:create', 'sandbox:exec', 'sandbox:read'] });
    expect(typeof claims.jti).toBe('string');

    const p = await createTokenVerifier(hs, { now: () => T0 + 1000 }).verify(`Bearer ${token}`);
    expect(p.tenant).toBe('team.rl-1');
    expect(p.scopes.has('sandbox:exec')).toBe(true);
  });

  it('rejects an unknown scope, listing the valid ones', async () => {
    const err = (await issueTokenCommand({ jwtConfig: hs, tenant: 'acme', scopes: ['sandbox:create', 'root'], ttl: '1h' }).then(
      () => undefined,
      (e: unknown) => e,
    )) as RollboxError;
    expect(err).toBeInstanceOf(RollboxError);
    expect(err.code).toBe('invalid_request');
    expect(err.message).toContain('unknown scope "root"');
    for (const s of SCOPES) expect(err.message).toContain(s);
  });

  it('rejects no scopes, a bad tenant and a junk TTL', async () => {
    await expect(issueTokenCommand({ jwtConfig: hs, tenant: 'acme', scopes: [], ttl: '1h' })).rejects.toThrow(/at least one scope/);
    await expect(issueTokenCommand({ jwtConfig: hs, tenant: 'a b', scopes: ['admin'], ttl: '1h' })).rejects.toThrow(/invalid tenant/);
    await expect(issueTokenCommand({ jwtConfig: hs, tenant: 'acme', scopes: ['admin'], ttl: 'soon' })).rejects.toThrow(/invalid TTL "soon"/);
  });
});

describe('createTokenIssuer', () => {
  it('needs privateKeyFile for asymmetric algorithms', async () => {
    const issuer = createTokenIssuer({ ...hs, alg: 'EdDSA', publicKeyFile: '/unused.pem' });
    await expect(issuer.issue({ tenant: 'acme', scopes: ['admin'], ttlSeconds: 60 })).rejects.toThrow(/needs privateKeyFile/);
  });

  it('validates ttlSeconds', async () => {
    const issuer = createTokenIssuer(hs);
    await expect(issuer.issue({ tenant: 'acme', scopes: ['admin'], ttlSeconds: 0 })).rejects.toThrow(/ttlSeconds/);
    await expect(issuer.issue({ tenant: 'acme', scopes: ['admin'], ttlSeconds: 1.5 })).rejects.toThrow(/ttlSeconds/);
  });
});
