import type { MiddlewareHandler } from 'hono';
import type { Principal, TokenVerifier } from '../iam/index.ts';

export type GatewayEnv = { Variables: { principal: Principal } };

/** Verifies the bearer token; routes then check scopes through the services. */
export function authenticate(verifier: TokenVerifier): MiddlewareHandler<GatewayEnv> {
  return async (c, next) => {
    c.set('principal', await verifier.verify(c.req.header('authorization')));
    await next();
  };
}
