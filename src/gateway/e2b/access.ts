import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { Scope } from '../../api/index.ts';
import type { Principal } from '../../iam/index.ts';
import { ConnectError } from './connect.ts';

const SECRET_KEY = 'rb:e2b:envd-secret';
const ENVD_SCOPES: ReadonlySet<Scope> = new Set(['sandbox:exec', 'sandbox:read']);

/** What the access token (or a URL signed with it) grants: commands and files in that one sandbox. */
export const principalOf = (sandboxId: string, tenant: string): Principal => ({ tenant, scopes: ENVD_SCOPES, subject: `envd:${sandboxId}` });

/**
 * The per-sandbox envd access token (`X-Access-Token`), which E2B hands out at create and
 * connect and the SDK sends on every envd call. It is an HMAC of the sandbox id and its
 * tenant under one secret that all gateways share through Redis (made once, by whichever
 * gateway asks first), so checking it costs no Redis call. It grants commands and files
 * in that one sandbox, for the sandbox's life, as E2B's does.
 */
export class EnvdAccess {
  private secret: Buffer | undefined;

  constructor(private readonly redis: Redis) {}

  private async key(): Promise<Buffer> {
    if (this.secret) return this.secret;
    await this.redis.set(SECRET_KEY, randomBytes(32).toString('hex'), 'NX');
    this.secret = Buffer.from((await this.redis.get(SECRET_KEY))!, 'hex');
    return this.secret;
  }

  async tokenFor(sandboxId: string, tenant: string): Promise<string> {
    const mac = createHmac('sha256', await this.key()).update(`envd:${sandboxId}:${tenant}`).digest('hex');
    return `${Buffer.from(tenant).toString('base64url')}.${mac}`;
  }

  /** The principal a valid token stands for (its tenant, commands and files), else `unauthenticated`. */
  async verify(sandboxId: string, token: string | undefined): Promise<Principal> {
    const [tenantPart, mac] = (token ?? '').split('.');
    if (!tenantPart || !mac) throw new ConnectError('unauthenticated', 'missing or malformed X-Access-Token (the envdAccessToken of create or connect)');
    const tenant = Buffer.from(tenantPart, 'base64url').toString('utf8');
    const expected = Buffer.from((await this.tokenFor(sandboxId, tenant)).split('.')[1]!);
    const given = Buffer.from(mac);
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) throw new ConnectError('unauthenticated', `X-Access-Token is not the one of sandbox ${sandboxId}`);
    return principalOf(sandboxId, tenant);
  }
}
