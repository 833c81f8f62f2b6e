import { createRoute, z } from '@hono/zod-openapi';
import type { ModelGateway } from '../../model-gateway/index.ts';
import { CreateSandboxRequest, JobActionResult, Layer, ListSandboxesQuery, PauseRequest, PolicyPatch, Sandbox, SandboxList, SnapshotRequest, TtlRequest } from '../../api/index.ts';
import type { TtlService } from '../ttl-service.ts';
import type { SandboxService } from '../sandbox-service.ts';
import { IdParam, errors, json, jsonBody, security, type GatewayApp } from './common.ts';

/** What the sandbox routes need of the sandbox service. */
export type SandboxApi = Pick<SandboxService, 'create' | 'list' | 'get' | 'delete' | 'setPaused' | 'setJobPaused' | 'snapshot' | 'setPolicy'>;

/** Sandboxes: create, read, list, release, pause/resume (one or a whole job), snapshot, stage policy. */
export type TtlApi = Pick<TtlService, 'setTtl'>;

/**
 * `modelHolds`: a job's pause also holds its model calls (taken before its sandboxes
 * freeze), and its resume releases them (after its sandboxes thaw, so no agent times out
 * on a reply that was there when it was thawed).
 */
export function registerSandboxRoutes(app: GatewayApp, sandboxes: SandboxApi, ttls: TtlApi, modelHolds?: Pick<ModelGateway, 'setJobPaused'>): void {
  app.openapi(
    createRoute({
      method: 'post',
      path: '/v1/sandboxes',
      security,
      request: { body: jsonBody(CreateSandboxRequest), headers: z.object({ 'idempotency-key': z.string().regex(/^[A-Za-z0-9_.:-]{1,128}$/).optional() }) },
      responses: {
        201: json(Sandbox, 'created and running'),
        200: json(Sandbox, 'replay of an earlier request with the same Idempotency-Key'),
        ...errors('not_found', 'conflict', 'payload_too_large', 'quota_exceeded', 'no_capacity', 'network_unavailable', 'admission_exhausted', 'timeout', 'node_lost'),
      },
    }),
    async (c) => {
      const { sandbox, replayed } = await sandboxes.create(c.get('principal'), c.req.valid('json'), c.req.valid('header')['idempotency-key']);
      return replayed ? c.json(sandbox, 200) : c.json(sandbox, 201);
    },
  );

  app.openapi(
    createRoute({ method: 'get', path: '/v1/sandboxes', security, request: { query: ListSandboxesQuery }, responses: { 200: json(SandboxList, 'own sandboxes, newest first'), ...errors() } }),
    async (c) => c.json({ sandboxes: await sandboxes.list(c.get('principal'), c.req.valid('query')) }, 200),
  );

  app.openapi(
    createRoute({ method: 'get', path: '/v1/sandboxes/{id}', security, request: { params: IdParam }, responses: { 200: json(Sandbox, 'the sandbox'), ...errors('not_found') } }),
    async (c) => c.json(await sandboxes.get(c.get('principal'), c.req.valid('param').id), 200),
  );

  app.openapi(
    createRoute({ method: 'delete', path: '/v1/sandboxes/{id}', security, request: { params: IdParam }, responses: { 200: json(Sandbox, 'released (terminal state)'), ...errors('not_found', 'timeout') } }),
    async (c) => c.json(await sandboxes.delete(c.get('principal'), c.req.valid('param').id), 200),
  );

  for (const action of ['pause', 'resume'] as const) {
    const paused = action === 'pause';
    const body = { required: false, content: { 'application/json': { schema: PauseRequest } } };
    app.openapi(
      createRoute({
        method: 'post',
        path: `/v1/sandboxes/{id}/${action}`,
        security,
        request: { params: IdParam, body },
        responses: { 200: json(Sandbox, `the sandbox after ${action}`), ...errors('not_found', 'invalid_state', 'conflict', 'timeout', 'no_capacity', 'network_unavailable') },
      }),
      async (c) => c.json(await sandboxes.setPaused(c.get('principal'), c.req.valid('param').id, paused, c.req.valid('json')?.mode), 200),
    );
    app.openapi(
      createRoute({
        method: 'post',
        path: `/v1/jobs/{job}/${action}`,
        security,
        request: { params: z.object({ job: z.string().max(128) }), body },
        responses: { 200: json(JobActionResult, `every live sandbox of the job, with its outcome`), ...errors() },
      }),
      async (c) => {
        const principal = c.get('principal');
        const { job } = c.req.valid('param');
        const held = paused ? await modelHolds?.setJobPaused(principal, job, true) : undefined;
        const result = await sandboxes.setJobPaused(principal, job, paused, c.req.valid('json')?.mode);
        const released = paused ? held : await modelHolds?.setJobPaused(principal, job, false);
        return c.json({ ...result, ...(released ? { model: released } : {}) }, 200);
      },
    );
  }

  app.openapi(
    createRoute({
      method: 'post',
      path: '/v1/sandboxes/{id}/snapshot',
      security,
      request: { params: IdParam, body: { required: false, content: { 'application/json': { schema: SnapshotRequest } } } },
      responses: { 201: json(Layer, 'the new layer (pack_diff of the writable layer), with its parents'), ...errors('not_found', 'invalid_state', 'conflict', 'timeout') },
    }),
    async (c) => c.json(await sandboxes.snapshot(c.get('principal'), c.req.valid('param').id, c.req.valid('json') ?? { exclude: [] }), 201),
  );

  app.openapi(
    createRoute({
      method: 'post',
      path: '/v1/sandboxes/{id}/ttl',
      security,
      request: { params: IdParam, body: jsonBody(TtlRequest) },
      responses: { 200: json(Sandbox, 'the sandbox with its new expiresAt'), ...errors('not_found', 'invalid_state', 'timeout') },
    }),
    async (c) => c.json(await ttls.setTtl(c.get('principal'), c.req.valid('param').id, c.req.valid('json').ttlSeconds), 200),
  );

  app.openapi(
    createRoute({
      method: 'patch',
      path: '/v1/sandboxes/{id}/policy',
      security,
      request: { params: IdParam, body: jsonBody(PolicyPatch) },
      responses: { 200: json(Sandbox, 'the sandbox with its new stage policy, in force'), ...errors('not_found', 'invalid_state', 'conflict', 'timeout', 'network_unavailable') },
    }),
    async (c) => c.json(await sandboxes.setPolicy(c.get('principal'), c.req.valid('param').id, c.req.valid('json')), 200),
  );
}
