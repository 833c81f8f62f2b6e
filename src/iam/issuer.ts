import { randomUUID } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { SignJWT, importPKCS8, type CryptoKey } from 'jose';
import { RollboxError, SCOPES, type Scope } from '../api/index.ts';
import type { JwtConfig } from './config.ts';
import { isScope, isValidTenant } from './principal.ts';
import { loadOrCreateHsSecret } from './secret.ts';
import { parseTtl } from './ttl.ts';

export interface TokenIssuerConfig extends JwtConfig {
  /** PEM PKCS#8 private key; required to issue EdDSA/ES256 tokens (tests and tools only). */
  privateKeyFile?: string | undefined;
}

export interface IssueTokenRequest {
  tenant: string;
  scopes: readonly Scope[];
  ttlSeconds: number;
  subject?: string;
}

export interface TokenIssuer {
  issue(request: IssueTokenRequest): Promise<string>;
}

export interface TokenIssuerDeps {
  /** Milliseconds since the epoch (Date.now semantics). */
  now?: () => number;
}

export function createTokenIssuer(jwtConfig: TokenIssuerConfig, deps: TokenIssuerDeps = {}): TokenIssuer {
  const now = deps.now ?? Date.now;
  let signingKey: Promise<CryptoKey> | undefined;
  const loadKey = () => {
    signingKey ??= loadSigningKey(jwtConfig).catch((err: unknown) => {
      signingKey = undefined;
      throw err;
    });
    return signingKey;
  };

  return {
    async issue({ tenant, scopes, ttlSeconds, subject }) {
      if (!isValidTenant(tenant)) throw new RollboxError('invalid_request', `invalid tenant ${JSON.stringify(tenant)}: expected [A-Za-z0-9_.-]{1,64}`);
      for (const scope of scopes) if (!isScope(scope)) throw unknownScope(scope);
      if (!Number.isSafeInteger(ttlSeconds) || ttlSeconds <= 0) throw new RollboxError('invalid_request', 'ttlSeconds must be a positive integer');
      const key = await loadKey();
      const iat = Math.floor(now() / 1000);
      const jwt = new SignJWT({ tenant, scopes: [...new Set(scopes)] })
        .setProtectedHeader({ alg: jwtConfig.alg, typ: 'JWT' })
        .setIssuer(jwtConfig.issuer)
        .setAudience(jwtConfig.audience)
        .setIssuedAt(iat)
        .setExpirationTime(iat + ttlSeconds)
        .setJti(randomUUID());
      if (subject !== undefined) jwt.setSubject(subject);
      return jwt.sign(key);
    },
  };
}

async function loadSigningKey(jwtConfig: TokenIssuerConfig): Promise<CryptoKey> {
  if (jwtConfig.alg === 'HS256') {
    const secret = await loadOrCreateHsSecret(jwtConfig.secretFile);
    return globalThis.crypto.subtle.importKey('raw', secret, { name: 'HMAC', hash: 'SHA-256' }, false, ['sign']);
  }
  if (!jwtConfig.privateKeyFile) {
    throw new RollboxError('invalid_request', `issuing ${jwtConfig.alg} tokens needs privateKeyFile (a PEM PKCS#8 private key)`);
  }
  return importPKCS8(await readFile(jwtConfig.privateKeyFile, 'utf8'), jwtConfig.alg);
}

function unknownScope(scope: string): RollboxError {
  return new RollboxError('invalid_request', `unknown scope ${JSON.stringify(scope)}; valid scopes: ${SCOPES.join(', ')}`);
}

export interface IssueTokenCommandInput {
  jwtConfig: TokenIssuerConfig;
  tenant: string;
  scopes: readonly string[];
  /** '1h', '30m', '45s', '2d' or plain seconds. */
  ttl: string;
  subject?: string;
  now?: () => number;
}

/** `rollbox token issue`: validates the CLI's strings and returns the token alone. */
export async function issueTokenCommand(input: IssueTokenCommandInput): Promise<string> {
  // Accept "a,b" and "a b" inside one argument too, as users type them either way.
  const requested = input.scopes.flatMap((s) => s.split(/[\s,]+/)).filter((s) => s !== '');
  if (requested.length === 0) throw new RollboxError('invalid_request', `at least one scope is required; valid scopes: ${SCOPES.join(', ')}`);
  const scopes: Scope[] = [];
  for (const scope of requested) {
    if (!isScope(scope)) throw unknownScope(scope);
    scopes.push(scope);
  }
  const ttlSeconds = parseTtl(input.ttl);
  const issuer = createTokenIssuer(input.jwtConfig, input.now ? { now: input.now } : {});
  return issuer.issue({ tenant: input.tenant, scopes, ttlSeconds, ...(input.subject !== undefined ? { subject: input.subject } : {}) });
}
