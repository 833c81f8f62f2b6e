import { Readable } from 'node:stream';
import { OpenAPIHono, createRoute, z } from '@hono/zod-openapi';
import { bodyLimit } from 'hono/body-limit';
import { streamSSE } from 'hono/streaming';
import { setMetric, timing } from 'hono/timing';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import {
  BurstPolicy,
  BurstStatus,
  CommandList,
  CommandStatus,
  CreateSandboxRequest,
  ErrorBody,
  ExecRequest,
  ExecResult,
  FILES_BYTES_TYPE,
  FILES_TAR_TYPE,
  FilesReadQuery,
  FilesWriteQuery,
  FilesWriteResult,
  Layer,
  JobActionResult,
  LayerList,
  LayerName,
  ListCommandsQuery,
  PauseRequest,
  PolicyPatch,
  SnapshotRequest,
  ListSandboxesQuery,
  NodeList,
  RollboxError,
  Sandbox,
  SandboxList,
  UploadLayerQuery,
} from '../api/index.ts';
import type { Config } from '../config/index.ts';
import { requireScope, type TokenVerifier } from '../iam/index.ts';
import type { NodeDirectory } from '../queues/index.ts';
import type { LayerRegistry } from '../registry/index.ts';
import { authenticate, type GatewayEnv } from './auth.ts';
import { describeZodError, errorResponse, handleError } from './errors.ts';
import type { GatewayMetrics } from './metrics.ts';
import type { ExecService } from './exec-service.ts';
import type { FilesService } from './files-service.ts';
import type { SandboxService } from './sandbox-service.ts';

/** Turns an uploaded tar into a stored EROFS layer (the layer store decides where). */
export type LayerBuilder = (tar: Readable, options: { maxBytes: number }) => Promise<{ digest: string; sizeBytes: number }>;

export interface GatewayDeps {
  config: Pick<Config, 'http' | 'files'>;
  redis: Redis;
  verifier: TokenVerifier;
  sandboxes: SandboxService;
  execs: ExecService;
  files: FilesService;
  layers: LayerRegistry;
  buildLayer: LayerBuilder;
  /** Path of a layer image in the store, for the blob download. */
  layerImagePath: (digest: string) => Promise<string | undefined>;
  directory: NodeDirectory;
  metrics: Pick<GatewayMetrics, 'registry' | 'middleware'>;
  logger: Logger;
  now: () => number;
  /** Cloud burst status and policy (src/burst). */
  burst?: { status(): Promise<BurstStatus>; setPolicy(policy: BurstPolicy): Promise<BurstPolicy> };
}

const errors = Object.fromEntries(
  [400, 401, 403, 404, 409, 413, 429, 503].map((status) => [status, { description: 'error', content: { 'application/json': { schema: ErrorBody } } }]),
) as Record<400 | 401 | 403 | 404 | 409 | 413 | 429 | 503, { description: string; content: { 'application/json': { schema: typeof ErrorBody } } }>;

const json = <T extends z.ZodType>(schema: T, description: string) => ({ description, content: { 'application/json': { schema } } });
const jsonBody = <T extends z.ZodType>(schema: T) => ({ required: true, content: { 'application/json': { schema } } });
const IdParam = z.object({ id: z.string().max(64) });
const security = [{ bearer: [] }];

export function createGateway(deps: GatewayDeps): OpenAPIHono<GatewayEnv> {
  const { sandboxes, execs } = deps;
  const app = new OpenAPIHono<GatewayEnv>({
    defaultHook: (result, c) => {
      if (!result.success) return errorResponse(c, 'invalid_request', describeZodError(result.error, result.target === 'json' ? 'body' : result.target));
    },
  });
  app.onError(handleError(deps.logger));
  app.notFound((c) => errorResponse(c, 'not_found', `no route ${c.req.method} ${c.req.path}`));
  app.openAPIRegistry.registerComponent('securitySchemes', 'bearer', { type: 'http', scheme: 'bearer', bearerFormat: 'JWT' });

  app.use('*', deps.metrics.middleware);

  // Operations (no auth: scraped and probed from inside the cluster).
  app.get('/healthz', (c) => c.json({ ok: true }));
  app.get('/metrics', async (c) => c.text(await deps.metrics.registry.metrics(), 200, { 'content-type': deps.metrics.registry.contentType }));
  app.get('/readyz', async (c) => {
    const redisOk = await deps.redis.ping().then(() => true, () => false);
    const nodes = deps.directory.list().filter((n) => n.healthy).length;
    return c.json({ ready: redisOk, redis: redisOk, healthyNodes: nodes }, redisOk ? 200 : 503);
  });
  app.doc31('/openapi.json', { openapi: '3.1.0', info: { title: 'rollbox', version: '1' } });

  // Everything under /v1 needs a token; JSON bodies are capped before any handler reads them.
  // Each answer says where its milliseconds went (Server-Timing: auth, and for exec
  // claim, dispatch, worker, run, total), readable with curl -v or a browser's devtools.
  app.use('/v1/*', timing({ totalDescription: 'gateway' }));
  app.use('/v1/*', authenticate(deps.verifier));
  const jsonLimit = bodyLimit({ maxSize: deps.config.http.bodyLimitBytes, onError: () => { throw new RollboxError('payload_too_large', `body is larger than ${deps.config.http.bodyLimitBytes} bytes`); } });
  // File uploads have their own (larger) cap.
  const filesLimit = bodyLimit({ maxSize: deps.config.files.maxBytes, onError: () => { throw new RollboxError('payload_too_large', `body is larger than the files limit of ${deps.config.files.maxBytes} bytes`); } });
  app.use('/v1/sandboxes/*', (c, next) => (/^\/v1\/sandboxes\/[^/]+\/files$/.test(c.req.path) ? filesLimit(c, next) : jsonLimit(c, next)));
  app.use('/v1/sandboxes', jsonLimit);
  app.use('/v1/jobs/*', jsonLimit);

  app.openapi(
    createRoute({
      method: 'post',
      path: '/v1/sandboxes',
      security,
      request: { body: jsonBody(CreateSandboxRequest), headers: z.object({ 'idempotency-key': z.string().regex(/^[A-Za-z0-9_.:-]{1,128}$/).optional() }) },
      responses: { 201: json(Sandbox, 'created and running'), 200: json(Sandbox, 'replay of an earlier request with the same Idempotency-Key'), ...errors },
    }),
    async (c) => {
      const { sandbox, replayed } = await sandboxes.create(c.get('principal'), c.req.valid('json'), c.req.valid('header')['idempotency-key']);
      return replayed ? c.json(sandbox, 200) : c.json(sandbox, 201);
    },
  );

  app.openapi(
    createRoute({ method: 'get', path: '/v1/sandboxes', security, request: { query: ListSandboxesQuery }, responses: { 200: json(SandboxList, 'own sandboxes, newest first'), ...errors } }),
    async (c) => c.json({ sandboxes: await sandboxes.list(c.get('principal'), c.req.valid('query')) }, 200),
  );

  app.openapi(
    createRoute({ method: 'get', path: '/v1/sandboxes/{id}', security, request: { params: IdParam }, responses: { 200: json(Sandbox, 'the sandbox'), ...errors } }),
    async (c) => c.json(await sandboxes.get(c.get('principal'), c.req.valid('param').id), 200),
  );

  app.openapi(
    createRoute({ method: 'delete', path: '/v1/sandboxes/{id}', security, request: { params: IdParam }, responses: { 200: json(Sandbox, 'released (terminal state)'), ...errors } }),
    async (c) => c.json(await sandboxes.delete(c.get('principal'), c.req.valid('param').id), 200),
  );

  app.openapi(
    createRoute({
      method: 'post',
      path: '/v1/sandboxes/{id}/exec',
      security,
      request: { params: IdParam, body: jsonBody(ExecRequest) },
      responses: { 200: json(ExecResult, 'the command finished (or timed out)'), 202: json(CommandStatus, 'background: the command was started'), ...errors },
    }),
    async (c) => {
      const { id } = c.req.valid('param');
      const request = c.req.valid('json');
      if (request.background) return c.json(await execs.startBackground(c.get('principal'), id, request), 202);
      if (!c.req.header('accept')?.includes('text/event-stream')) return c.json(await execs.exec(c.get('principal'), id, request, (hop, ms) => setMetric(c, hop, ms)), 200);
      // Streaming: errors before the first event still answer as JSON with their status.
      const events = execs.streamExec(c.get('principal'), id, request, c.req.header('last-event-id') || '0');
      const first = await events.next();
      return streamSSE(c, async (sse) => {
        try {
          for (let next = first; !next.done; next = await events.next()) await sse.writeSSE(next.value);
        } catch (err) {
          const error = err instanceof RollboxError ? { code: err.code, message: err.message } : { code: 'internal', message: 'internal error' };
          await sse.writeSSE({ event: 'error', data: JSON.stringify({ error }) });
        }
      }) as never; // an SSE response, outside the JSON response types of the route
    },
  );

  app.openapi(
    createRoute({
      method: 'get',
      path: '/v1/sandboxes/{id}/commands',
      security,
      request: { params: IdParam, query: ListCommandsQuery },
      responses: { 200: json(CommandList, 'the command log (trajectory), oldest first'), ...errors },
    }),
    async (c) => c.json({ commands: await execs.commandLog(c.get('principal'), c.req.valid('param').id, c.req.valid('query').limit) }, 200),
  );

  app.openapi(
    createRoute({
      method: 'get',
      path: '/v1/sandboxes/{id}/commands/{commandId}',
      security,
      request: { params: z.object({ id: z.string().max(64), commandId: z.string().max(128) }) },
      responses: { 200: json(CommandStatus, 'a command (e.g. a background one): state, result, output so far'), ...errors },
    }),
    async (c) => c.json(await execs.commandStatus(c.get('principal'), c.req.valid('param').id, c.req.valid('param').commandId), 200),
  );

  for (const action of ['pause', 'resume'] as const) {
    const paused = action === 'pause';
    const body = { required: false, content: { 'application/json': { schema: PauseRequest } } };
    app.openapi(
      createRoute({ method: 'post', path: `/v1/sandboxes/{id}/${action}`, security, request: { params: IdParam, body }, responses: { 200: json(Sandbox, `the sandbox after ${action}`), ...errors } }),
      async (c) => c.json(await sandboxes.setPaused(c.get('principal'), c.req.valid('param').id, paused, c.req.valid('json')?.mode), 200),
    );
    app.openapi(
      createRoute({
        method: 'post',
        path: `/v1/jobs/{job}/${action}`,
        security,
        request: { params: z.object({ job: z.string().max(128) }), body },
        responses: { 200: json(JobActionResult, `every live sandbox of the job, with its outcome`), ...errors },
      }),
      async (c) => c.json(await sandboxes.setJobPaused(c.get('principal'), c.req.valid('param').job, paused, c.req.valid('json')?.mode), 200),
    );
  }

  app.openapi(
    createRoute({
      method: 'post',
      path: '/v1/sandboxes/{id}/snapshot',
      security,
      request: { params: IdParam, body: { required: false, content: { 'application/json': { schema: SnapshotRequest } } } },
      responses: { 201: json(Layer, 'the new layer (pack_diff of the writable layer), with its parents'), ...errors },
    }),
    async (c) => c.json(await sandboxes.snapshot(c.get('principal'), c.req.valid('param').id, c.req.valid('json') ?? { exclude: [] }), 201),
  );

  // Files: paths resolve inside the sandbox (src/workers/files.ts).
  const binary = (description: string) => ({
    description,
    content: { [FILES_BYTES_TYPE]: { schema: z.string().openapi({ format: 'binary' }) }, [FILES_TAR_TYPE]: { schema: z.string().openapi({ format: 'binary' }) } },
  });
  app.openapi(
    createRoute({
      method: 'get',
      path: '/v1/sandboxes/{id}/files',
      security,
      request: { params: IdParam, query: FilesReadQuery },
      responses: { 200: binary(`a regular file as its bytes (${FILES_BYTES_TYPE}); a directory, or anything with format=tar or Accept: ${FILES_TAR_TYPE}, as a tar`), ...errors },
    }),
    async (c) => {
      const query = c.req.valid('query');
      const accept = c.req.header('accept') ?? '';
      const format = accept.includes(FILES_TAR_TYPE) && !accept.includes(FILES_BYTES_TYPE) ? 'tar' : query.format;
      const { body, tar } = await deps.files.read(c.get('principal'), c.req.valid('param').id, { ...query, format });
      return c.body(body as Uint8Array<ArrayBuffer>, 200, { 'content-type': tar ? FILES_TAR_TYPE : FILES_BYTES_TYPE }) as never; // binary, outside the JSON response types
    },
  );
  app.openapi(
    createRoute({
      method: 'put',
      path: '/v1/sandboxes/{id}/files',
      security,
      request: { params: IdParam, query: FilesWriteQuery, body: { required: true, ...binary(`${FILES_TAR_TYPE}: extracted into the directory at path; anything else: written as the file at path`) } },
      responses: { 200: json(FilesWriteResult, 'written'), ...errors },
    }),
    async (c) => {
      const body = Buffer.from(await c.req.arrayBuffer());
      return c.json(await deps.files.write(c.get('principal'), c.req.valid('param').id, c.req.valid('query'), body, c.req.header('content-type')), 200);
    },
  );
  app.openapi(
    createRoute({
      method: 'patch',
      path: '/v1/sandboxes/{id}/policy',
      security,
      request: { params: IdParam, body: jsonBody(PolicyPatch) },
      responses: { 200: json(Sandbox, 'the sandbox with its new stage policy, in force'), ...errors },
    }),
    async (c) => c.json(await sandboxes.setPolicy(c.get('principal'), c.req.valid('param').id, c.req.valid('json')), 200),
  );

  // Layers: a tar goes in, an EROFS layer comes out.
  app.post('/v1/layers', async (c) => {
    requireScope(c.get('principal'), 'layer:write');
    const query = UploadLayerQuery.safeParse(c.req.query());
    if (!query.success) return errorResponse(c, 'invalid_request', describeZodError(query.error, 'query'));
    const declared = Number(c.req.header('content-length') ?? NaN);
    const maxBytes = deps.config.http.layerUploadLimitBytes;
    if (declared > maxBytes) return errorResponse(c, 'payload_too_large', `layer tar is larger than ${maxBytes} bytes`);
    if (!c.req.raw.body) return errorResponse(c, 'invalid_request', 'body: a tar archive is required');
    const built = await deps.buildLayer(Readable.fromWeb(c.req.raw.body as never), { maxBytes });
    const layer = await deps.layers.register({ digest: built.digest, sizeBytes: built.sizeBytes, name: query.data.name, parents: [], createdAt: new Date(deps.now()).toISOString() });
    return c.json(layer, 201);
  });
  app.openapi(
    createRoute({ method: 'get', path: '/v1/layers', security, responses: { 200: json(LayerList, 'registered layers'), ...errors } }),
    async (c) => {
      requireLayerRead(c.get('principal'));
      return c.json({ layers: await deps.layers.list() }, 200);
    },
  );
  app.openapi(
    createRoute({ method: 'get', path: '/v1/layers/{ref}', security, request: { params: z.object({ ref: z.string().max(140) }) }, responses: { 200: json(Layer, 'a layer by digest or name'), ...errors } }),
    async (c) => {
      requireLayerRead(c.get('principal'));
      return c.json(await deps.layers.resolve(c.req.valid('param').ref), 200);
    },
  );
  app.openapi(
    createRoute({
      method: 'delete',
      path: '/v1/layers/{name}',
      security,
      request: { params: z.object({ name: LayerName }) },
      responses: { 200: json(Layer, 'the layer without that name; once nothing references it, garbage collection removes it after the grace period'), ...errors },
    }),
    async (c) => {
      requireScope(c.get('principal'), 'layer:write');
      return c.json(await deps.layers.unname(c.req.valid('param').name), 200);
    },
  );
  app.get('/v1/layers/:ref/blob', async (c) => {
    requireLayerRead(c.get('principal'));
    const layer = await deps.layers.resolve(c.req.param('ref'));
    const imagePath = await deps.layerImagePath(layer.digest);
    if (!imagePath) return errorResponse(c, 'not_found', `layer ${layer.digest} has no image in this gateway's store`);
    const { createReadStream } = await import('node:fs');
    c.header('Content-Type', 'application/octet-stream');
    c.header('Content-Length', String(layer.sizeBytes));
    return c.body(Readable.toWeb(createReadStream(imagePath)) as ReadableStream);
  });

  app.openapi(
    createRoute({ method: 'get', path: '/v1/nodes', security, responses: { 200: json(NodeList, 'worker hosts and their last heartbeats'), ...errors } }),
    (c) => {
      requireScope(c.get('principal'), 'admin');
      return c.json({ nodes: deps.directory.list() }, 200);
    },
  );

  registerBurstRoutes(app, deps.burst, jsonLimit);
  return app;
}

function registerBurstRoutes(app: OpenAPIHono<GatewayEnv>, burst: GatewayDeps['burst'], jsonLimit: ReturnType<typeof bodyLimit>): void {
  const enabled = () => {
    if (!burst) throw new RollboxError('not_found', 'cloud burst is not enabled on this gateway');
    return burst;
  };
  app.openapi(
    createRoute({ method: 'get', path: '/v1/burst', security, responses: { 200: json(BurstStatus, 'diversion state, local utilization, counts, cloud hosts'), ...errors } }),
    async (c) => {
      requireScope(c.get('principal'), 'sandbox:read');
      return c.json(await enabled().status(), 200);
    },
  );
  app.use('/v1/burst/*', jsonLimit);
  app.openapi(
    createRoute({ method: 'put', path: '/v1/burst/policy', security, request: { body: jsonBody(BurstPolicy) }, responses: { 200: json(BurstPolicy, 'the stored policy, defaults filled in'), ...errors } }),
    async (c) => {
      requireScope(c.get('principal'), 'burst:admin');
      return c.json(await enabled().setPolicy(c.req.valid('json')), 200);
    },
  );
}

function requireLayerRead(principal: Parameters<typeof requireScope>[0]): void {
  if (principal.scopes.has('sandbox:create') || principal.scopes.has('layer:write')) return;
  requireScope(principal, 'layer:read');
}
