import { createRoute } from '@hono/zod-openapi';
import type { MiddlewareHandler } from 'hono';
import { BurstSimulation, BurstSimulationRequest, CapacityQuery, CapacityReport, ConsoleQuery, ConsoleSnapshot } from '../../api/index.ts';
import { requireScope } from '../../iam/index.ts';
import type { ConsoleService } from '../console/index.ts';
import { errors, json, jsonBody, security, type GatewayApp } from './common.ts';

export type ConsoleApi = Pick<ConsoleService, 'capacity' | 'snapshot' | 'simulate'>;

/** The operator console's data (scope cluster:read, or admin): capacity, everything the page shows, a burst simulation. */
export function registerConsoleRoutes(app: GatewayApp, deps: { console: ConsoleApi; jsonLimit: MiddlewareHandler }): void {
  app.openapi(
    createRoute({
      method: 'get',
      path: '/v1/cluster/capacity',
      security,
      request: { query: CapacityQuery },
      responses: { 200: json(CapacityReport, "Little's law over a stable window: admission rate, mean residence, concurrency, safe load per node, nodes needed, one node more or fewer"), ...errors() },
    }),
    async (c) => {
      requireScope(c.get('principal'), 'cluster:read');
      return c.json(await deps.console.capacity(c.req.valid('query')), 200);
    },
  );
  app.openapi(
    createRoute({
      method: 'get',
      path: '/v1/cluster/console',
      security,
      request: { query: ConsoleQuery },
      responses: { 200: json(ConsoleSnapshot, 'what the console page shows: nodes, warm pools, burst, the signals over time, capacity'), ...errors() },
    }),
    async (c) => {
      requireScope(c.get('principal'), 'cluster:read');
      return c.json(await deps.console.snapshot(c.req.valid('query')), 200);
    },
  );
  app.openapi(
    createRoute({
      method: 'post',
      path: '/v1/burst/simulation',
      security,
      request: { body: jsonBody(BurstSimulationRequest) },
      responses: { 200: json(BurstSimulation, 'the current burst policy replayed over a generated trace, and a sweep of thresholds and VM caps (figures and an SVG chart)'), ...errors('payload_too_large') },
    }),
    async (c) => {
      requireScope(c.get('principal'), 'cluster:read');
      return c.json(await deps.console.simulate(c.req.valid('json')), 200);
    },
  );
}
