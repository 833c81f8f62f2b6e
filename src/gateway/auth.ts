import type { MiddlewareHandler } from 'hono';
import { setMetric, type TimingVariables } from 'hono/timing';
import type { Principal, TokenVerifier } from '../iam/index.ts';

export type GatewayEnv = { Variables: { principal: Principal } & TimingVariables };

/**
 * For SandboxFusion clients (verl), which cannot add a header: the token may also come as
 * `?token=` or as HTTP Basic credentials (a URL's `user:token@host`; the password, or the
 * user when there is none). A bearer header still wins. Tokens in URLs end up in logs:
 * give such clients short-lived tokens with `sandbox:run` only.
 */
export function authenticateFromUrl(verifier: TokenVerifier): MiddlewareHandler<GatewayEnv> {
  return async (c, next) => {
    const header = c.req.header('authorization');
    const basic = header?.match(/^Basic\s+(\S+)$/i)?.[1];
    let bearer = header;
    if (basic) {
      const [user = '', ...rest] = Buffer.from(basic, 'base64').toString('utf8').split(':');
      bearer = `Bearer ${rest.join(':') || user}`;
    } else if (!header && c.req.query('token')) bearer = `Bearer ${c.req.query('token')}`;
    c.set('principal', await verifier.verify(bearer));
    await next();
  };
}

/** Verifies the bearer token (its time is the Server-Timing `auth` entry); routes then check scopes through the services. */
export function authenticate(verifier: TokenVerifier): MiddlewareHandler<GatewayEnv> {
  return async (c, next) => {
    const started = performance.now();
    c.set('principal', await verifier.verify(c.req.header('authorization')));
    setMetric(c, 'auth', performance.now() - started);
    await next();
  };
}
