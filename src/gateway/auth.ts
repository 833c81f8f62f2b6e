import type { MiddlewareHandler } from 'hono';
import { setMetric, type TimingVariables } from 'hono/timing';
import { ROLLOUT_KEY_PATTERN, RollboxError } from '../api/index.ts';
import type { Principal, RolloutKeyStore, TokenVerifier } from '../iam/index.ts';

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

/**
 * Verifies the bearer token (its time is the Server-Timing `auth` entry); routes then check
 * scopes through the services. A hosted rollout's key (`rbr_...`) is looked up in the
 * rollout key store instead, from `Authorization: Bearer` or, as the Anthropic SDKs send
 * it, `x-api-key`.
 */
export function authenticate(verifier: TokenVerifier, rolloutKeys?: Pick<RolloutKeyStore, 'verify'>): MiddlewareHandler<GatewayEnv> {
  return async (c, next) => {
    const started = performance.now();
    const authorization = c.req.header('authorization');
    const rolloutKey = rolloutKeyOf(authorization, c.req.header('x-api-key'));
    if (rolloutKey && !rolloutKeys) throw new RollboxError('unauthenticated', 'this gateway does not host rollouts (no rollout key store)');
    c.set('principal', rolloutKey ? await rolloutKeys!.verify(rolloutKey) : await verifier.verify(authorization));
    setMetric(c, 'auth', performance.now() - started);
    await next();
  };
}

function rolloutKeyOf(authorization: string | undefined, apiKey: string | undefined): string | undefined {
  const bearer = authorization?.match(/^Bearer[ \t]+(\S+)[ \t]*$/i)?.[1];
  if (bearer !== undefined) return ROLLOUT_KEY_PATTERN.test(bearer) ? bearer : undefined;
  return authorization === undefined && apiKey !== undefined && ROLLOUT_KEY_PATTERN.test(apiKey) ? apiKey : undefined;
}

/** The model gateway's routes, OpenAI- and Anthropic-shaped, at the root of /v1 (addressed by the key alone). */
export const MODEL_ROUTE_PATHS: ReadonlySet<string> = new Set(['/v1/chat/completions', '/v1/completions', '/v1/responses', '/v1/messages', '/v1/messages/count_tokens', '/v1/models']);
/** The same routes under a rollout's own prefix: `/v1/rollouts/<id>/model/v1/chat/completions`, ... */
const ROLLOUT_PREFIXED = /^\/v1\/rollouts\/([^/]+)(?:\/(model\/v1\/.+|trajectory))?$/;
/** What a rollout key may do to one of its sandboxes: read it, run and follow commands, move files. */
const SANDBOX_ROUTE = /^\/v1\/sandboxes\/([^/]+)(?:\/(exec|commands(?:\/.*)?|files(?:\/.*)?))?$/;

/**
 * Keeps a hosted rollout's agent inside its rollout: a principal that came with a rollout
 * key reaches the model routes, its own rollout's record and trajectory, and the sandboxes
 * granted to the rollout (read, exec, commands, files); every other route is `forbidden`
 * (allowlist, so a route added later is closed to agents until it is listed here). Other
 * principals pass untouched.
 */
export function confineRolloutKeys(rolloutKeys: Pick<RolloutKeyStore, 'allowsSandbox'>): MiddlewareHandler<GatewayEnv> {
  return async (c, next) => {
    const grant = c.get('principal').rollout;
    if (!grant) return next();
    const path = c.req.path;
    if (MODEL_ROUTE_PATHS.has(path)) return next();
    const own = ROLLOUT_PREFIXED.exec(path);
    if (own) {
      if (own[1] !== grant.id) throw new RollboxError('not_found', `rollout ${own[1]} not found`);
      if (own[2]?.startsWith('model/') || c.req.method === 'GET') return next();
    }
    const sandbox = SANDBOX_ROUTE.exec(path);
    if (sandbox && (sandbox[2] !== undefined || c.req.method === 'GET')) {
      if (!(await rolloutKeys.allowsSandbox(grant, sandbox[1]!))) throw new RollboxError('not_found', `sandbox ${sandbox[1]} not found`);
      return next();
    }
    throw new RollboxError('forbidden', `a rollout key reaches only its rollout's sandboxes and the model gateway, not ${c.req.method} ${path}`);
  };
}
