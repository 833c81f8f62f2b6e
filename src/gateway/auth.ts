import type { MiddlewareHandler } from 'hono';
import { setMetric, type TimingVariables } from 'hono/timing';
import type { Principal, TokenVerifier } from '../iam/index.ts';

export type GatewayEnv = { Variables: { principal: Principal } & TimingVariables };

/** Verifies the bearer token (its time is the Server-Timing `auth` entry); routes then check scopes through the services. */
export function authenticate(verifier: TokenVerifier): MiddlewareHandler<GatewayEnv> {
  return async (c, next) => {
    const started = performance.now();
    c.set('principal', await verifier.verify(c.req.header('authorization')));
    setMetric(c, 'auth', performance.now() - started);
    await next();
  };
}
