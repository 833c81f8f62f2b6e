import { createRoute, z } from '@hono/zod-openapi';
import type { Context, MiddlewareHandler } from 'hono';
import { ModelBinding, ModelBindingView, RollboxError, httpStatusOf, type ModelApi } from '../../api/index.ts';
import { errorBody, type ModelGateway } from '../../model-gateway/index.ts';
import { isRedisUnavailable } from '../../redis/index.ts';
import type { GatewayEnv } from '../auth.ts';
import { errors, json, jsonBody, security, type GatewayApp } from './common.ts';

/** What the model routes call. */
export type ModelApiDeps = Pick<ModelGateway, 'call' | 'countTokens' | 'models' | 'putBinding' | 'view' | 'deleteBinding'>;

const CALLS: readonly [string, ModelApi][] = [
  ['/chat/completions', 'chat.completions'],
  ['/completions', 'completions'],
  ['/responses', 'responses'],
  ['/messages', 'messages'],
];
const JobParam = z.object({ job: z.string().regex(/^[A-Za-z0-9_.:-]{1,128}$/) });
/** A model route, at the root of /v1 or under a rollout's prefix. */
const MODEL_PATH = /^\/v1(?:\/rollouts\/[^/]+\/model\/v1)?\/(chat\/completions|completions|responses|messages(?:\/count_tokens)?|models)$/;

/** The error shape a model route's client parses: Anthropic's on /messages, OpenAI's on the rest; undefined off the model routes. */
export function modelErrorFlavor(path: string): 'openai' | 'anthropic' | undefined {
  const m = MODEL_PATH.exec(path);
  if (!m) return undefined;
  return m[1]!.startsWith('messages') ? 'anthropic' : 'openai';
}

/** An error on a model route, in the shape its SDK reads (the status from the one code table). */
export function modelErrorResponse(flavor: 'openai' | 'anthropic', err: unknown): Response {
  const e = err instanceof RollboxError ? err : isRedisUnavailable(err) ? new RollboxError('unavailable', 'Redis is not available now; retry', 2) : new RollboxError('internal', 'internal error');
  const status = httpStatusOf(e.code);
  return Response.json(errorBody(flavor, status, e.code, e.message), { status, headers: e.retryAfterSeconds !== undefined ? { 'retry-after': String(e.retryAfterSeconds) } : {} });
}

/**
 * The model gateway (docs/model-gateway.md): OpenAI- and Anthropic-shaped model calls of
 * a rollout's agent, by its rollout key, at the root of /v1 and under
 * `/v1/rollouts/:id/model/v1` (the agent's OPENAI_BASE_URL); and the trainer's
 * registration of a job's upstreams (`/v1/jobs/:job/model`).
 */
export function registerModelRoutes(app: GatewayApp, deps: { model: ModelApiDeps; jsonLimit: MiddlewareHandler }): void {
  const { model } = deps;
  const guarded = (flavor: 'openai' | 'anthropic', handle: (c: Context<GatewayEnv>) => Promise<Response>) => async (c: Context<GatewayEnv>) => {
    try {
      return await handle(c);
    } catch (err) {
      return modelErrorResponse(flavor, err);
    }
  };
  const rid = (c: Context<GatewayEnv>) => c.req.param('rid');
  for (const prefix of ['/v1', '/v1/rollouts/:rid/model/v1']) {
    for (const [suffix, api] of CALLS) {
      app.use(`${prefix}${suffix}`, deps.jsonLimit);
      app.post(`${prefix}${suffix}`, guarded(api === 'messages' ? 'anthropic' : 'openai', (c) => model.call(c.get('principal'), api, c.req.raw, rid(c))));
    }
    app.use(`${prefix}/messages/count_tokens`, deps.jsonLimit);
    app.post(`${prefix}/messages/count_tokens`, guarded('anthropic', (c) => model.countTokens(c.get('principal'), c.req.raw, rid(c))));
    app.get(`${prefix}/models`, guarded('openai', (c) => model.models(c.get('principal'), c.req.raw, rid(c))));
  }

  app.openapi(
    createRoute({ method: 'put', path: '/v1/jobs/{job}/model', security, request: { params: JobParam, body: jsonBody(ModelBinding) }, responses: { 200: json(ModelBindingView, 'the binding as stored (header values hidden), the hold state, the figures'), ...errors('payload_too_large') } }),
    async (c) => c.json(await model.putBinding(c.get('principal'), c.req.valid('param').job, c.req.valid('json')), 200),
  );
  app.openapi(
    createRoute({ method: 'get', path: '/v1/jobs/{job}/model', security, request: { params: JobParam }, responses: { 200: json(ModelBindingView, 'the binding (header values hidden; null: none), the hold state, the job\'s model figures'), ...errors() } }),
    async (c) => c.json(await model.view(c.get('principal'), c.req.valid('param').job), 200),
  );
  app.openapi(
    createRoute({ method: 'delete', path: '/v1/jobs/{job}/model', security, request: { params: JobParam }, responses: { 200: json(ModelBindingView, 'the binding is gone: new calls are held until one is registered'), ...errors('not_found') } }),
    async (c) => c.json(await model.deleteBinding(c.get('principal'), c.req.valid('param').job), 200),
  );
}
