import { createRoute } from '@hono/zod-openapi';
import type { MiddlewareHandler } from 'hono';
import { BurstPolicy, BurstStatus, NodeList, RollboxError } from '../../api/index.ts';
import { requireScope } from '../../iam/index.ts';
import type { NodeDirectory } from '../../queues/index.ts';
import { errors, json, jsonBody, security, type GatewayApp } from './common.ts';

/** Cloud burst status and policy (src/burst). */
export interface BurstApi {
  status(): Promise<BurstStatus>;
  setPolicy(policy: BurstPolicy): Promise<BurstPolicy>;
}

/** The cluster: worker hosts (admin), cloud burst status and policy. */
export function registerClusterRoutes(app: GatewayApp, deps: { directory: Pick<NodeDirectory, 'list'>; burst?: BurstApi; jsonLimit: MiddlewareHandler }): void {
  app.openapi(createRoute({ method: 'get', path: '/v1/nodes', security, responses: { 200: json(NodeList, 'worker hosts and their last heartbeats'), ...errors() } }), (c) => {
    requireScope(c.get('principal'), 'admin');
    return c.json({ nodes: deps.directory.list() }, 200);
  });

  const burst = (): BurstApi => {
    if (!deps.burst) throw new RollboxError('not_found', 'cloud burst is not enabled on this gateway');
    return deps.burst;
  };
  app.openapi(
    createRoute({ method: 'get', path: '/v1/burst', security, responses: { 200: json(BurstStatus, 'diversion state, local utilization, counts, cloud hosts'), ...errors('not_found') } }),
    async (c) => {
      requireScope(c.get('principal'), 'sandbox:read');
      return c.json(await burst().status(), 200);
    },
  );
  app.use('/v1/burst/*', deps.jsonLimit);
  app.openapi(
    createRoute({ method: 'put', path: '/v1/burst/policy', security, request: { body: jsonBody(BurstPolicy) }, responses: { 200: json(BurstPolicy, 'the stored policy, defaults filled in'), ...errors('not_found', 'payload_too_large') } }),
    async (c) => {
      requireScope(c.get('principal'), 'burst:admin');
      return c.json(await burst().setPolicy(c.req.valid('json')), 200);
    },
  );
}
