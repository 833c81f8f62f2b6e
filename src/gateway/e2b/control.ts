import type { Context } from 'hono';
import { bodyLimit } from 'hono/body-limit';
import type { GatewayApp } from '../routes/common.ts';
import { CreateSandboxRequest, E2bListQuery, E2bNewSandbox, E2bPauseBody, E2bTimeoutBody, RollboxError, type PauseMode, type Sandbox } from '../../api/index.ts';
import { readerOf, type E2bKeyStore, type Principal } from '../../iam/index.ts';
import type { SandboxService } from '../sandbox-service.ts';
import type { TtlService } from '../ttl-service.ts';
import type { EnvdAccess } from './access.ts';
import { CLIENT_ID, DEFAULT_TEMPLATE, DEFAULT_TIMEOUT_SECONDS, ENVD_VERSION, TEMPLATE_LABEL, jsonOf, liveSandbox, parse, routeOf, sandboxBody, templateOf, type Handler } from './control-common.ts';
import { networkOf } from './network.ts';
import { restError } from './rest-error.ts';
import type { E2bTemplates } from './templates.ts';

export interface E2bControlDeps {
  sandboxes: Pick<SandboxService, 'create' | 'get' | 'list' | 'delete' | 'setPaused'>;
  ttls: Pick<TtlService, 'setTtl'>;
  keys: Pick<E2bKeyStore, 'verify'>;
  access: Pick<EnvdAccess, 'tokenFor'>;
  /** The sandboxes' domain (ROLLBOX_E2B_DOMAIN): getHost(port) is `<port>-<id>.<domain>`. */
  domain: string;
  templates: Pick<E2bTemplates, 'imageOf'>;
  /** How E2B's pause (and auto-pause) pauses when it keeps memory, and how long a paused sandbox is kept. */
  pause: { mode: PauseMode; pausedTtlSeconds: number };
  /** Runs a built template's start and ready commands in a new sandbox of it (none: templates have none). */
  startTemplate?: (principal: Principal, sandboxId: string, template: string) => Promise<void>;
}

/** E2B's bodies are small: metadata, env and a template name. */
const MAX_BODY_BYTES = 1024 * 1024;

const e2bState = (s: Sandbox) => (s.state === 'paused' || s.state === 'hibernated' ? 'paused' : 'running');
const metadataOf = (s: Sandbox) => Object.fromEntries(Object.entries(s.spec.labels).filter(([k]) => k !== TEMPLATE_LABEL));

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
    metadata: metadataOf(s),
    allowInternetAccess: s.spec.network.mode === 'allowlist',
    lifecycle: { onTimeout: s.spec.onTtl?.action === 'pause' ? 'pause' : 'kill', autoResume: s.spec.onTtl?.autoResume === true },
    network: { allowPublicTraffic: s.spec.publicTraffic === true, allowOut: s.spec.network.allow.map((r) => r.cidr ?? r.host!) },
  };
}

/**
 * E2B's control plane (the REST API the SDK sends to E2B_API_URL) over rollbox's own
 * services: a template is an image or layer name (`base`: the cluster's base template),
 * `timeout` the TTL, `envVars` the sandbox env, `metadata` its labels, auto-pause the TTL's
 * `pause` action. Pause keeps memory (the configured mode) unless `memory: false`
 * (hibernate); a paused sandbox is kept for the paused TTL, and connect resumes it.
 * Ended sandboxes are not found, as on E2B.
 */
export function registerE2bControl(app: GatewayApp, deps: E2bControlDeps): void {
  const { sandboxes, ttls, access, templates, pause, domain } = deps;
  // Connection: close, as the rest of the body may still be on its way (see withUploadBody).
  const limit = bodyLimit({ maxSize: MAX_BODY_BYTES, onError: (c) => (c.header('Connection', 'close'), restError(c, new RollboxError('payload_too_large', `body is larger than ${MAX_BODY_BYTES} bytes`))) });
  for (const path of ['/sandboxes', '/sandboxes/*', '/v2/sandboxes', '/v2/sandboxes/*']) app.use(path, limit);
  const route = routeOf(deps.keys);
  const live = (principal: Principal, id: string) => liveSandbox(sandboxes, principal, id);

  const create: Handler = async (c, principal) => {
    const body = parse(E2bNewSandbox, await jsonOf(c), 'body');
    const template = body.templateID ?? DEFAULT_TEMPLATE;
    const image = await templates.imageOf(template, readerOf(principal));
    const network = networkOf({ allowOut: body.network?.allowOut, denyOut: body.network?.denyOut, allowInternetAccess: body.allow_internet_access });
    const request = parse(
      CreateSandboxRequest,
      {
        ...(image ? { image } : {}),
        ttlSeconds: body.timeout ?? DEFAULT_TIMEOUT_SECONDS,
        env: body.envVars ?? {},
        labels: { ...body.metadata, [TEMPLATE_LABEL]: template },
        ...(network ? { network } : {}),
        ...(body.autoPause ? { onTtl: { action: 'pause', mode: body.autoPauseMemory === false ? 'hibernate' : pause.mode, pausedTtlSeconds: pause.pausedTtlSeconds, ...(body.autoResume?.enabled ? { autoResume: true } : {}) } } : {}),
        ...(body.network?.allowPublicTraffic ? { publicTraffic: true } : {}),
        // E2B's templates give their user passwordless sudo: the base template's does.
        ...(template === DEFAULT_TEMPLATE && image ? { allowPrivilegeEscalation: true } : {}),
      },
      'body',
    );
    const { sandbox } = await sandboxes.create(principal, request, undefined);
    await deps.startTemplate?.(principal, sandbox.id, template);
    return c.json(await sandboxBody(access, sandbox, domain), 201);
  };
  app.post('/sandboxes', route(create));
  app.post('/v2/sandboxes', route(create));

  /**
   * A paused sandbox is resumed (201) and runs `timeout` from now (its paused TTL was far
   * longer); a running one has its TTL extended to `timeout`, never shortened (200).
   */
  const resume = async (principal: Principal, sandbox: Sandbox, timeout: number | undefined, mustBePaused: boolean) => {
    const paused = sandbox.state !== 'running';
    if (!paused && mustBePaused) throw new RollboxError('conflict', `sandbox ${sandbox.id} is already running`);
    if (paused) await sandboxes.setPaused(principal, sandbox.id, false);
    const after = await ttls.setTtl(principal, sandbox.id, timeout || DEFAULT_TIMEOUT_SECONDS, { extendOnly: !paused });
    return { body: await sandboxBody(access, after, domain), status: paused ? (201 as const) : (200 as const) };
  };
  const connect: Handler = async (c, principal) => {
    const { timeout } = parse(E2bTimeoutBody, await jsonOf(c), 'body');
    const { body, status } = await resume(principal, await live(principal, c.req.param('id')!), timeout, false);
    return c.json(body, status);
  };
  app.post('/sandboxes/:id/connect', route(connect));
  app.post('/v2/sandboxes/:id/connect', route(connect));
  app.post(
    '/sandboxes/:id/resume',
    route(async (c, principal) => {
      const { timeout } = parse(E2bTimeoutBody, await jsonOf(c), 'body');
      return c.json((await resume(principal, await live(principal, c.req.param('id')!), timeout, true)).body, 201);
    }),
  );

  app.get(
    '/sandboxes/:id',
    route(async (c, principal) => {
      const sandbox = await live(principal, c.req.param('id')!);
      return c.json({ ...listed(sandbox), envdAccessToken: await access.tokenFor(sandbox.id, sandbox.tenant), domain }, 200);
    }),
  );

  const list = async (c: Context, principal: Principal, paged: boolean) => {
    const query = parse(E2bListQuery, c.req.query(), 'query');
    const wanted = new Set((query.state ?? 'running,paused').split(',').map((s) => s.trim()));
    const metadata = [...new URLSearchParams(query.metadata ?? '')].map(([k, v]) => [decodeURIComponent(k), decodeURIComponent(v)] as const);
    const after = query.startedAfter ? Date.parse(query.startedAfter) : -Infinity;
    const startOf = (s: Sandbox) => Date.parse(s.startedAt ?? s.createdAt);
    const all = (await sandboxes.list(principal, { limit: 1000 }))
      .filter((s) => ['running', 'paused', 'hibernated'].includes(s.state) && wanted.has(e2bState(s)) && metadata.every(([k, v]) => s.spec.labels[k] === v))
      .filter((s) => startOf(s) > after && (query.template === undefined || templateOf(s) === query.template))
      // Over the whole result, as E2B orders it (newest first unless asked).
      .sort((a, b) => (query.order === 'asc' ? startOf(a) - startOf(b) : startOf(b) - startOf(a)) || a.id.localeCompare(b.id));
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

  // Paused, as on E2B, it no longer runs against its timeout: it is kept for the paused TTL.
  app.post(
    '/sandboxes/:id/pause',
    route(async (c, principal) => {
      const { memory } = parse(E2bPauseBody, await jsonOf(c), 'body');
      const id = c.req.param('id')!;
      if ((await live(principal, id)).state !== 'running') throw new RollboxError('conflict', `sandbox ${id} is already paused`);
      await sandboxes.setPaused(principal, id, true, memory === false ? 'hibernate' : pause.mode);
      await ttls.setTtl(principal, id, pause.pausedTtlSeconds);
      return c.body(null, 204);
    }),
  );
}
