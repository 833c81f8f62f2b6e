import { createRoute } from '@hono/zod-openapi';
import { SandboxMetrics } from '../../api/index.ts';
import type { SandboxMetricsService } from '../sandbox-metrics.ts';
import { IdParam, errors, json, security, type GatewayApp } from './common.ts';

/** `GET /v1/sandboxes/:id/metrics`: one sample of a running sandbox's CPU, memory and disk use, read from its cgroups by its host. */
export function registerMetricsRoutes(app: GatewayApp, metrics: Pick<SandboxMetricsService, 'sample'>): void {
  app.openapi(
    createRoute({
      method: 'get',
      path: '/v1/sandboxes/{id}/metrics',
      security,
      request: { params: IdParam },
      responses: { 200: json(SandboxMetrics, 'one sample, now'), ...errors('not_found', 'invalid_state', 'timeout', 'tier_unsupported') },
    }),
    async (c) => c.json(await metrics.sample(c.get('principal'), c.req.valid('param').id), 200),
  );
}
