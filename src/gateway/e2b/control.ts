import type { Context } from 'hono';
import { bodyLimit } from 'hono/body-limit';
import type { GatewayApp } from '../routes/common.ts';
import type { z } from 'zod';
import { CreateSandboxRequest, E2bListQuery, E2bNewSandbox, E2bPauseBody, E2bTimeoutBody, RollboxError, isTerminal, type Sandbox } from '../../api/index.ts';
import type { E2bKeyStore, Principal } from '../../iam/index.ts';
import { describeZodError } from '../errors.ts';
import type { SandboxService } from '../sandbox-service.ts';
import type { TtlService } from '../ttl-service.ts';
import type { EnvdAccess } from './access.ts';
import { restError } from './rest-error.ts';

export interface E2bControlDeps {
  sandboxes: Pick<SandboxService, 'create' | 'get' | 'list' | 'delete' | 'setPaused'>;
  ttls: Pick<TtlService, 'setTtl'>;
  keys: Pick<E2bKeyStore, 'verify'>;
  access: Pick<EnvdAccess, 'tokenFor'>;
}

/**
 * The envd version reported: >= 0.4.0 (the SDK then sends no default user), >= 0.5.2
 * (closeStdin allowed), >= 0.5.7 (octet-stream uploads, served), < 0.6.2 (no file metadata
 * headers). Other self-hosted servers report the same.
 */
export const ENVD_VERSION = '0.6.1';
/** E2B's own API answers this "for backwards compatibility"; the Python SDK requires the field. */
const CLIENT_ID = '00000000';
const DEFAULT_TIMEOUT_SECONDS = 300;
/** E2B's bodies are small: metadata, env and a template name. */
const MAX_BODY_BYTES = 1024 * 1024;
/** The SDK's default template: rollbox's default image. */
const DEFAULT_TEMPLATE = 'base';

function parse<T extends z.ZodType>(schema: T, value: unknown, where: string): z.infer<T> {
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw new RollboxError('invalid_request', describeZodError(parsed.error, where));
  return parsed.data;
}

async function jsonOf(c: Context): Promise<unknown> {
  const text = await c.req.text();
  if (!text.trim()) return {};
  try {
    return JSON.parse(text);
  } catch {
    throw new RollboxError('invalid_request', 'body: not JSON');
  }
}

const templateOf = (s: Sandbox) => s.spec.image.base ?? s.spec.image.ref ?? DEFAULT_TEMPLATE;
const e2bState = (s: Sandbox) => (s.state === 'paused' || s.state === 'hibernated' ? 'paused' : 'running');

function listed(s: Sandbox) {
  return {
    sandboxID: s.id,
    templateID: templateOf(s),
    clientID: CLIENT_ID,
    startedAt: s.startedAt ?? s.createdAt,
    endAt: s.expiresAt ?? s.startedAt ?? s.createdAt,
    cpuCount: Math.max(1, Math.ceil(s.spec.resources.cpuMillis / 1000)),
    memoryMB: s.spec.resources.memoryMiB,
    diskSizeMB: s.spec.resources.diskMiB,
    state: e2bState(s),
    envdVersion: ENVD_VERSION,
    metadata: s.spec.labels,
  };
}

/**
 * E2B's control plane (the REST API the SDK sends to E2B_API_URL) over rollbox's own
 * services: a template is an image or layer name (`base`: the default image), `timeout`
 * the TTL, `envVars` the sandbox env, `metadata` its labels; pause keeps memory (the
 * freezer) unless `memory: false` (hibernate). Ended sandboxes are not found, as on E2B.
 */
export function registerE2bControl(app: GatewayApp, deps: E2bControlDeps): void {
  const { sandboxes, ttls, keys, access } = deps;
  // Connection: close, as the rest of the body may still be on its way (see withUploadBody).
  const limit = bodyLimit({ maxSize: MAX_BODY_BYTES, onError: (c) => (c.header('Connection', 'close'), restError(c, new RollboxError('payload_too_large', `body is larger than ${MAX_BODY_BYTES} bytes`))) });
  for (const path of ['/sandboxes', '/sandboxes/*', '/v2/sandboxes', '/v2/sandboxes/*']) app.use(path, limit);
  type Handler = (c: Context, principal: Principal) => Promise<Response>;
  const route = (handler: Handler) => async (c: Context) => {
    try {
      return await handler(c, await keys.verify(c.req.header('x-api-key')));
    } catch (err) {
      return restError(c, err);
    }
  };
  const live = async (principal: Principal, id: string): Promise<Sandbox> => {
    const sandbox = await sandboxes.get(principal, id);
    if (isTerminal(sandbox.state) || sandbox.state === 'stopping') throw new RollboxError('not_found', `sandbox ${id} not found (it ended: ${sandbox.state})`);
    return sandbox;
  };
  const sandboxBody = async (s: Sandbox) => ({
    sandboxID: s.id,
    templateID: templateOf(s),
    clientID: CLIENT_ID,
    envdVersion: ENVD_VERSION,
    envdAccessToken: await access.tokenFor(s.id, s.tenant),
    domain: null,
  });

  const create: Handler = async (c, principal) => {
    const body = parse(E2bNewSandbox, await jsonOf(c), 'body');
    const template = body.templateID ?? DEFAULT_TEMPLATE;
    const request = parse(
      CreateSandboxRequest,
      {
        ...(template === DEFAULT_TEMPLATE ? {} : { image: { base: template } }),
        ttlSeconds: body.timeout ?? DEFAULT_TIMEOUT_SECONDS,
        env: body.envVars ?? {},
        labels: body.metadata ?? {},
      },
      'body',
    );
    const { sandbox } = await sandboxes.create(principal, request, undefined);
    return c.json(await sandboxBody(sandbox), 201);
  };
  app.post('/sandboxes', route(create));
  app.post('/v2/sandboxes', route(create));

  // Connect resumes a paused sandbox (201) and extends its TTL, never shortening it.
  const connect: Handler = async (c, principal) => {
    const { timeout } = parse(E2bTimeoutBody, await jsonOf(c), 'body');
    const id = c.req.param('id')!;
    const resumed = (await live(principal, id)).state !== 'running';
    if (resumed) await sandboxes.setPaused(principal, id, false);
    const sandbox = await ttls.setTtl(principal, id, timeout || DEFAULT_TIMEOUT_SECONDS, { extendOnly: true });
    return c.json(await sandboxBody(sandbox), resumed ? 201 : 200);
  };
  app.post('/sandboxes/:id/connect', route(connect));
  app.post('/v2/sandboxes/:id/connect', route(connect));
  app.post(
    '/sandboxes/:id/resume',
    route(async (c, principal) => {
      const { timeout } = parse(E2bTimeoutBody, await jsonOf(c), 'body');
      const id = c.req.param('id')!;
      if ((await live(principal, id)).state === 'running') throw new RollboxError('conflict', `sandbox ${id} is already running`);
      await sandboxes.setPaused(principal, id, false);
      return c.json(await sandboxBody(await ttls.setTtl(principal, id, timeout || DEFAULT_TIMEOUT_SECONDS, { extendOnly: true })), 201);
    }),
  );

  app.get(
    '/sandboxes/:id',
    route(async (c, principal) => {
      const sandbox = await live(principal, c.req.param('id')!);
      return c.json({ ...listed(sandbox), envdAccessToken: await access.tokenFor(sandbox.id, sandbox.tenant), domain: null }, 200);
    }),
  );

  const list = async (c: Context, principal: Principal, paged: boolean) => {
    const query = parse(E2bListQuery, c.req.query(), 'query');
    const wanted = new Set((query.state ?? 'running,paused').split(',').map((s) => s.trim()));
    const metadata = [...new URLSearchParams(query.metadata ?? '')].map(([k, v]) => [decodeURIComponent(k), decodeURIComponent(v)] as const);
    const all = (await sandboxes.list(principal, { limit: 1000 })).filter(
      (s) => ['running', 'paused', 'hibernated'].includes(s.state) && wanted.has(e2bState(s)) && metadata.every(([k, v]) => s.spec.labels[k] === v),
    );
    const offset = paged ? Number(query.nextToken ?? 0) || 0 : 0;
    const page = paged ? all.slice(offset, offset + query.limit) : all;
    if (paged && offset + query.limit < all.length) c.header('X-Next-Token', String(offset + query.limit));
    return c.json(page.map(listed), 200);
  };
  app.get('/v2/sandboxes', route((c, principal) => list(c, principal, true)));
  app.get('/sandboxes', route((c, principal) => list(c, principal, false)));

  app.delete(
    '/sandboxes/:id',
    route(async (c, principal) => {
      const id = c.req.param('id')!;
      await live(principal, id);
      await sandboxes.delete(principal, id);
      return c.body(null, 204);
    }),
  );

  app.post(
    '/sandboxes/:id/timeout',
    route(async (c, principal) => {
      const { timeout } = parse(E2bTimeoutBody, await jsonOf(c), 'body');
      const id = c.req.param('id')!;
      await live(principal, id);
      await ttls.setTtl(principal, id, Math.max(1, timeout ?? DEFAULT_TIMEOUT_SECONDS));
      return c.body(null, 204);
    }),
  );

  app.post(
    '/sandboxes/:id/pause',
    route(async (c, principal) => {
      const { memory } = parse(E2bPauseBody, await jsonOf(c), 'body');
      const id = c.req.param('id')!;
      if ((await live(principal, id)).state !== 'running') throw new RollboxError('conflict', `sandbox ${id} is already paused`);
      await sandboxes.setPaused(principal, id, true, memory === false ? 'hibernate' : 'freeze');
      return c.body(null, 204);
    }),
  );
}
