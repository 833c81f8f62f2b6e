import { createRoute } from '@hono/zod-openapi';
import { RunCodeRequest, RunCodeResponse, RunRequest, RunResult, type RunCodeLanguage } from '../../api/index.ts';
import { runCode } from '../run-code.ts';
import type { RunService } from '../run-service.ts';
import { errors, json, jsonBody, security, type GatewayApp } from './common.ts';

export type RunApi = Pick<RunService, 'run'>;

/** The function-call tier: POST /v1/run, and SandboxFusion's POST /run_code on top of it (scope sandbox:run). */
export function registerRunRoutes(app: GatewayApp, runs: RunApi, languages: Readonly<Record<string, RunCodeLanguage>>): void {
  app.openapi(
    createRoute({
      method: 'post',
      path: '/run_code',
      security,
      request: { body: jsonBody(RunCodeRequest) },
      responses: { 200: json(RunCodeResponse, "SandboxFusion's answer: Success, Failed (a non-zero exit or the time limit) or SandboxError (the platform failed)"), ...errors('not_found', 'payload_too_large', 'quota_exceeded') },
    }),
    async (c) => c.json(await runCode(runs, c.get('principal'), c.req.valid('json'), languages), 200),
  );
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
