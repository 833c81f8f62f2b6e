import { createRoute } from '@hono/zod-openapi';
import { RunRequest, RunResult } from '../../api/index.ts';
import type { RunService } from '../run-service.ts';
import { errors, json, jsonBody, security, type GatewayApp } from './common.ts';

export type RunApi = Pick<RunService, 'run'>;

/** The function-call tier: POST /v1/run (scope sandbox:run). */
export function registerRunRoutes(app: GatewayApp, runs: RunApi): void {
  app.openapi(
    createRoute({
      method: 'post',
      path: '/v1/run',
      security,
      request: { body: jsonBody(RunRequest) },
      responses: { 200: json(RunResult, 'the command ran (ok, failed or timeout) or the platform failed (infra_error, safe to retry)'), ...errors('not_found', 'payload_too_large', 'quota_exceeded') },
    }),
    async (c) => c.json(await runs.run(c.get('principal'), c.req.valid('json')), 200),
  );
}
