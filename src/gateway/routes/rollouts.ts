import { createRoute, z } from '@hono/zod-openapi';
import type { MiddlewareHandler } from 'hono';
import { Batch, CreateRolloutRequest, JobRolloutTimes, Rollout, RolloutModel, Trajectory } from '../../api/index.ts';
import type { RolloutService } from '../../rollouts/index.ts';
import type { BatchApi } from './batches.ts';
import { errors, json, jsonBody, security, type GatewayApp } from './common.ts';

/** A rollout attempt's id: `<batchId>.<customId>.<attempt>` (its result line's `rollout.id`). */
const RolloutIdParam = z.object({ id: z.string().max(256) });
const JobParam = z.object({ job: RolloutModel.shape.job });

/**
 * Hosted rollouts (docs/api.md): submit one (a batch of one task with an agent, followed like
 * any batch), read an attempt and its trajectory, and where a job's rollouts spent their time.
 */
export function registerRolloutRoutes(app: GatewayApp, deps: { batches: Pick<BatchApi, 'submitRollout'>; rollouts: Pick<RolloutService, 'get' | 'trajectory' | 'jobTimes'>; jsonLimit: MiddlewareHandler }): void {
  app.use('/v1/rollouts', deps.jsonLimit);
  app.openapi(
    createRoute({ method: 'post', path: '/v1/rollouts', security, request: { body: jsonBody(CreateRolloutRequest) }, responses: { 201: json(Batch, 'the batch of one task that runs the rollout: follow it with /v1/batches/{id}/results'), ...errors('payload_too_large') } }),
    async (c) => c.json(await deps.batches.submitRollout(c.get('principal'), c.req.valid('json')), 201),
  );
  app.openapi(
    createRoute({ method: 'get', path: '/v1/rollouts/{id}', security, request: { params: RolloutIdParam }, responses: { 200: json(Rollout, 'where the attempt runs, its task state, its model usage'), ...errors('not_found') } }),
    async (c) => c.json(await deps.rollouts.get(c.get('principal'), c.req.valid('param').id), 200),
  );
  app.openapi(
    createRoute({ method: 'get', path: '/v1/rollouts/{id}/trajectory', security, request: { params: RolloutIdParam }, responses: { 200: json(Trajectory, 'its model calls and task-sandbox commands, in the order they began'), ...errors('not_found') } }),
    async (c) => c.json(await deps.rollouts.trajectory(c.get('principal'), c.req.valid('param').id), 200),
  );
  app.openapi(
    createRoute({ method: 'get', path: '/v1/jobs/{job}/rollout-times', security, request: { params: JobParam }, responses: { 200: json(JobRolloutTimes, 'the job\'s ended rollouts by how they ended, and where their time went (sums, ms)'), ...errors() } }),
    async (c) => c.json(await deps.rollouts.jobTimes(c.get('principal'), c.req.valid('param').job), 200),
  );
}
