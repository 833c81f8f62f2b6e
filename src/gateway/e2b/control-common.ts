import type { Context } from 'hono';
import type { z } from 'zod';
import { RollboxError, isTerminal, type Sandbox } from '../../api/index.ts';
import type { E2bKeyStore, Principal } from '../../iam/index.ts';
import { describeZodError } from '../errors.ts';
import type { SandboxService } from '../sandbox-service.ts';
import type { EnvdAccess } from './access.ts';
import { restError } from './rest-error.ts';

/**
 * The envd version reported: >= 0.4.0 (the SDK then sends no default user), >= 0.5.2
 * (closeStdin allowed), >= 0.5.7 (octet-stream uploads), >= 0.6.2 (file metadata, the
 * `X-Metadata-*` headers of uploads), < 0.6.3 (no entry info in watch events).
 */
export const ENVD_VERSION = '0.6.2';
/** E2B's own API answers this "for backwards compatibility"; the Python SDK requires the field. */
export const CLIENT_ID = '00000000';
export const DEFAULT_TIMEOUT_SECONDS = 300;
/** The SDK's default template. */
export const DEFAULT_TEMPLATE = 'base';

export type Handler = (c: Context, principal: Principal) => Promise<Response>;

export function parse<T extends z.ZodType>(schema: T, value: unknown, where: string): z.infer<T> {
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw new RollboxError('invalid_request', describeZodError(parsed.error, where));
  return parsed.data;
}

export async function jsonOf(c: Context): Promise<unknown> {
  const text = await c.req.text();
  if (!text.trim()) return {};
  try {
    return JSON.parse(text);
  } catch {
    throw new RollboxError('invalid_request', 'body: not JSON');
  }
}

/** A handler behind the `X-API-Key` check; every error in E2B's `{code, message}` shape. */
export const routeOf = (keys: Pick<E2bKeyStore, 'verify'>) => (handler: Handler) => async (c: Context) => {
  try {
    return await handler(c, await keys.verify(c.req.header('x-api-key')));
  } catch (err) {
    return restError(c, err);
  }
};

/** The sandbox while it lives: an ended one is not found, as on E2B. */
export async function liveSandbox(sandboxes: Pick<SandboxService, 'get'>, principal: Principal, id: string): Promise<Sandbox> {
  const sandbox = await sandboxes.get(principal, id);
  if (isTerminal(sandbox.state) || sandbox.state === 'stopping') throw new RollboxError('not_found', `sandbox ${id} not found (it ended: ${sandbox.state})`);
  return sandbox;
}

/** The label an E2B create records its template in (the image may be a snapshot's stack); not shown in E2B's metadata. */
export const TEMPLATE_LABEL = 'e2b.template';

export const templateOf = (s: Sandbox) => s.spec.labels[TEMPLATE_LABEL] ?? s.spec.image.base ?? s.spec.image.ref ?? DEFAULT_TEMPLATE;

/** What create, connect and each fork child answer; `domain`: what the SDK's getHost(port) names hosts under. */
export async function sandboxBody(access: Pick<EnvdAccess, 'tokenFor'>, s: Sandbox, domain: string) {
  const token = await access.tokenFor(s.id, s.tenant);
  return {
    sandboxID: s.id,
    templateID: templateOf(s),
    clientID: CLIENT_ID,
    envdVersion: ENVD_VERSION,
    envdAccessToken: token,
    // Traffic into the sandbox's ports carries this (the port proxy checks it) unless it was created public.
    ...(s.spec.publicTraffic ? {} : { trafficAccessToken: token }),
    domain,
  };
}
