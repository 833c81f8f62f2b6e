import { createRoute, z } from '@hono/zod-openapi';
import { bodyLimit } from 'hono/body-limit';
import { streamSSE } from 'hono/streaming';
import { Build, BuildContext, BuildRequest, LayerDigest, RollboxError, type BuildLogEvent } from '../../api/index.ts';
import type { Principal } from '../../iam/index.ts';
import { errors, json, jsonBody, security, type GatewayApp } from './common.ts';

/** Image builds (src/builds BuildService). */
export interface BuildApi {
  putContext(principal: Principal, archive: Buffer): Promise<BuildContext>;
  findContext(principal: Principal, digest: string): Promise<BuildContext>;
  request(principal: Principal, request: BuildRequest): Promise<Build>;
  get(principal: Principal, id: string): Promise<Build>;
  log(principal: Principal, id: string, after: number): Promise<{ build: Build; events: BuildLogEvent[] }>;
  nextAppend(id: string, ms: number): Promise<void>;
}

const BuildIdParam = z.object({ id: z.string().regex(/^bld_[A-Za-z0-9_-]{1,60}$/) });
/** How often the event stream looks for new log lines unless this gateway, running the build, wakes it at once. */
const EVENTS_POLL_MS = 250;
/** An event stream ends after this long even if the build has not (the client reconnects with Last-Event-ID). */
const EVENTS_MAX_MS = 30 * 60_000;

export function registerBuildRoutes(app: GatewayApp, builds: BuildApi, limits: { contextMaxBytes: number; jsonLimit: Parameters<GatewayApp['use']>[1] }): void {
  // A context is a tar of any layout, checked whole here before anything names it.
  app.use('/v1/images/builds/contexts', bodyLimit({ maxSize: limits.contextMaxBytes, onError: () => { throw new RollboxError('payload_too_large', `a build context is at most ${limits.contextMaxBytes} bytes (ROLLBOX_BUILD_CONTEXT_MAX_BYTES)`); } }));
  app.use('/v1/images/builds', limits.jsonLimit);
  app.post('/v1/images/builds/contexts', async (c) => {
    const archive = Buffer.from(await c.req.arrayBuffer());
    if (archive.length === 0) throw new RollboxError('invalid_request', 'body: the build context (a tar) is required');
    return c.json(await builds.putContext(c.get('principal'), archive), 201);
  });
  app.openAPIRegistry.registerPath({
    method: 'post',
    path: '/v1/images/builds/contexts',
    security,
    description: 'A build context (a tar, `application/x-tar`): checked whole (no names out of it, no symlinks out of it, only files, directories and symlinks), kept by its digest for builds to name.',
    request: { body: { required: true, content: { 'application/x-tar': { schema: z.string() } } } },
    responses: { 201: json(BuildContext, 'the context\'s digest'), ...errors('invalid_archive', 'payload_too_large') },
  });
  app.openapi(
    createRoute({
      method: 'get',
      path: '/v1/images/builds/contexts/{digest}',
      security,
      description: 'A context this tenant uploaded, if it is still kept (its time is extended): a client that has the digest of its tar sends the bytes only when this answers 404.',
      request: { params: z.object({ digest: LayerDigest }) },
      responses: { 200: json(BuildContext, 'the context, kept'), ...errors('not_found') },
    }),
    async (c) => c.json(await builds.findContext(c.get('principal'), c.req.valid('param').digest), 200),
  );
  app.openapi(
    createRoute({
      method: 'post',
      path: '/v1/images/builds',
      security,
      request: { body: jsonBody(BuildRequest) },
      responses: { 202: json(Build, 'the build, `queued`; it ends `ready` (the image is stored under its name) or `failed`'), ...errors('invalid_dockerfile', 'build_unsupported', 'not_found', 'conflict') },
    }),
    async (c) => c.json(await builds.request(c.get('principal'), c.req.valid('json')), 202),
  );
  app.openapi(
    createRoute({ method: 'get', path: '/v1/images/builds/{id}', security, request: { params: BuildIdParam }, responses: { 200: json(Build, 'the build and each step\'s state'), ...errors('not_found') } }),
    async (c) => c.json(await builds.get(c.get('principal'), c.req.valid('param').id), 200),
  );
  // Server-sent events: `step` (a step's state changed), `output` (a failed RUN's output), `end` (the build ended: its record).
  app.get('/v1/images/builds/:id/events', async (c) => {
    const principal = c.get('principal');
    const id = c.req.param('id');
    let after = Number(c.req.header('last-event-id') ?? c.req.query('after') ?? -1);
    if (!Number.isInteger(after)) after = -1;
    await builds.get(principal, id);
    return streamSSE(c, async (sse) => {
      const until = Date.now() + EVENTS_MAX_MS;
      while (!sse.aborted && !sse.closed && Date.now() < until) {
        const { build, events } = await builds.log(principal, id, after);
        for (const e of events) {
          await sse.writeSSE({ event: e.kind, id: String(e.seq), data: JSON.stringify(e.kind === 'end' ? { ...e, build } : { ...e, steps: build.steps.length }) });
          after = e.seq;
          if (e.kind === 'end') return;
        }
        if (events.length === 0) await builds.nextAppend(id, EVENTS_POLL_MS);
      }
    });
  });
}
