import path from 'node:path';
import { RollboxError, type ErrorCode, type RunOnce, type RunRequest, type RunResult, type Scope } from '../api/index.ts';
import type { Redis } from 'ioredis';
import { requireScope, type Principal } from '../iam/index.ts';
import type { SandboxService } from './sandbox-service.ts';

export interface RunServiceDeps {
  sandboxes: Pick<SandboxService, 'create' | 'delete'>;
  /** Large fetched files come by a transfer key (see workers/run-once.ts). */
  redis: Pick<Redis, 'getdel'>;
  /** Cap on one fetched file (the files API's). */
  fetchMaxBytes: number;
  now: () => number;
}

/** What the steps of a run need, granted by `sandbox:run` alone. */
const RUN_SCOPES: Scope[] = ['sandbox:create', 'sandbox:delete'];
/** The sandbox of a run outlives its command by at most this (should the discard be lost). */
const SANDBOX_TTL_MARGIN_SEC = 120;
/**
 * Failures that are the caller's (a bad request, a layer that does not exist, a quota):
 * answered as HTTP errors. Every other failure is the platform's: `infra_error`.
 */
const CALLER_ERRORS: ReadonlySet<ErrorCode> = new Set(['invalid_request', 'invalid_archive', 'unauthenticated', 'forbidden', 'not_found', 'payload_too_large', 'quota_exceeded', 'conflict']);

/**
 * The function-call tier: one command in a fresh sandbox, which is discarded afterwards
 * whatever happened. The same create as the rest of the API (placement, admission, warm
 * pools, isolation), carrying the run: once the sandbox runs, its host writes the files,
 * runs the command, reads the fetched files and discards it, and answers once (see
 * workers/run-once.ts), instead of a round trip through Redis for each of those steps.
 */
export class RunService {
  constructor(private readonly deps: RunServiceDeps) {}

  async run(principal: Principal, request: RunRequest): Promise<RunResult> {
    requireScope(principal, 'sandbox:run');
    const startedAt = this.deps.now();
    const acting: Principal = { ...principal, scopes: new Set([...principal.scopes, ...RUN_SCOPES]) };
    let sandboxId: string | undefined;
    let pool: string | undefined;
    const answer = (result: Omit<RunResult, 'totalMs' | 'sandboxId' | 'pool'>): RunResult => ({ ...result, totalMs: this.deps.now() - startedAt, ...(sandboxId ? { sandboxId } : {}), ...(pool ? { pool } : {}) });
    const resolve = (file: string): string => path.posix.resolve(request.workdir, file);
    const run: RunOnce = {
      argv: request.argv ?? ['/bin/sh', '-c', request.cmd!],
      ...(request.stdin !== undefined ? { stdin: request.stdin } : {}),
      env: request.env,
      cwd: request.workdir,
      timeoutMs: request.timeoutMs,
      files: Object.fromEntries(Object.entries(request.files).map(([file, content]) => [resolve(file), content])),
      fetch: request.fetch.map(resolve),
      fetchMaxBytes: this.deps.fetchMaxBytes,
    };
    let ran = false;
    try {
      const created = await this.deps.sandboxes.create(
        acting,
        {
          image: request.image,
          resources: request.resources,
          class: request.class,
          network: request.network,
          workdir: request.workdir,
          hiddenPaths: [],
          env: {},
          labels: { 'rollbox.run': 'true' },
          ttlSeconds: Math.ceil(request.timeoutMs / 1000) + SANDBOX_TTL_MARGIN_SEC,
        },
        undefined,
        run,
      );
      sandboxId = created.sandbox.id;
      pool = created.sandbox.pool;
      if (!created.ran) throw new RollboxError('node_lost', `the worker host of sandbox ${sandboxId} was lost while the command ran`);
      ran = true;
      const { result, filesKey } = created.ran;
      const files = filesKey ? (JSON.parse((await this.deps.redis.getdel(filesKey)) ?? '{}') as Record<string, string>) : created.ran.files;
      const status = result.timedOut ? 'timeout' : result.exitCode === 0 ? 'ok' : 'failed';
      // Fetched files, under the paths as the request gave them.
      const fetched = Object.fromEntries(request.fetch.flatMap((file) => (files[resolve(file)] !== undefined ? [[file, files[resolve(file)]!]] : [])));
      return answer({ status, exitCode: result.timedOut ? null : result.exitCode, stdout: result.stdout, stderr: result.stderr, truncated: result.truncated, oomKilled: result.oomKilled, durationMs: result.durationMs, files: fetched });
    } catch (err) {
      if (err instanceof RollboxError && CALLER_ERRORS.has(err.code)) throw err;
      const error = err instanceof RollboxError ? { code: err.code, message: err.message } : { code: 'internal', message: String(err) };
      return answer({ status: 'infra_error', exitCode: null, stdout: '', stderr: '', truncated: false, oomKilled: false, durationMs: 0, files: {}, error });
    } finally {
      // Its host discards the sandbox with the answer; without one, it is deleted here.
      if (sandboxId && !ran) await this.deps.sandboxes.delete(acting, sandboxId).catch(() => undefined);
    }
  }
}
