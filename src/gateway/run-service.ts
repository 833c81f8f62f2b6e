import path from 'node:path';
import { FILES_BYTES_TYPE, RollboxError, type ErrorCode, type RunRequest, type RunResult, type Scope } from '../api/index.ts';
import { requireScope, type Principal } from '../iam/index.ts';
import type { ExecService } from './exec-service.ts';
import type { FilesService } from './files-service.ts';
import type { SandboxService } from './sandbox-service.ts';

export interface RunServiceDeps {
  sandboxes: Pick<SandboxService, 'create' | 'delete'>;
  files: Pick<FilesService, 'write' | 'read'>;
  execs: Pick<ExecService, 'exec'>;
  now: () => number;
}

/** What the steps of a run need, granted by `sandbox:run` alone. */
const RUN_SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:delete', 'sandbox:read'];
/** The sandbox of a run outlives its command by at most this (should the discard be lost). */
const SANDBOX_TTL_MARGIN_SEC = 120;
/**
 * Failures that are the caller's (a bad request, a layer that does not exist, a quota):
 * answered as HTTP errors. Every other failure is the platform's: `infra_error`.
 */
const CALLER_ERRORS: ReadonlySet<ErrorCode> = new Set(['invalid_request', 'invalid_archive', 'unauthenticated', 'forbidden', 'not_found', 'payload_too_large', 'quota_exceeded', 'conflict']);

/**
 * The function-call tier: one command in a fresh sandbox, which is discarded afterwards
 * whatever happened. Built on the same create (warm pools included), files, exec and
 * delete as the rest of the API, so it has their isolation and their failure handling.
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
    try {
      const { sandbox } = await this.deps.sandboxes.create(
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
      );
      sandboxId = sandbox.id;
      pool = sandbox.pool;
      for (const [file, content] of Object.entries(request.files)) {
        const target = path.posix.resolve(request.workdir, file);
        await this.deps.files.write(acting, sandbox.id, { path: target }, Buffer.from(content, 'base64'), FILES_BYTES_TYPE);
      }
      const result = await this.deps.execs.exec(acting, sandbox.id, { argv: request.argv, cmd: request.cmd, stdin: request.stdin, env: request.env, timeoutMs: request.timeoutMs, background: false });
      const status = result.timedOut ? 'timeout' : result.exitCode === 0 ? 'ok' : 'failed';
      const files = await this.fetch(acting, sandbox.id, request);
      return answer({ status, exitCode: result.timedOut ? null : result.exitCode, stdout: result.stdout, stderr: result.stderr, truncated: result.truncated, oomKilled: result.oomKilled, durationMs: result.durationMs, files });
    } catch (err) {
      if (err instanceof RollboxError && CALLER_ERRORS.has(err.code)) throw err;
      const error = err instanceof RollboxError ? { code: err.code, message: err.message } : { code: 'internal', message: String(err) };
      return answer({ status: 'infra_error', exitCode: null, stdout: '', stderr: '', truncated: false, oomKilled: false, durationMs: 0, files: {}, error });
    } finally {
      if (sandboxId) await this.deps.sandboxes.delete(acting, sandboxId).catch(() => undefined);
    }
  }

  /** The regular files among `request.fetch` that exist, as base64 (a directory or a missing path is left out). */
  private async fetch(acting: Principal, sandboxId: string, request: RunRequest): Promise<Record<string, string>> {
    const out: Record<string, string> = {};
    for (const file of request.fetch) {
      const read = await this.deps.files.read(acting, sandboxId, { path: path.posix.resolve(request.workdir, file), format: 'auto' }).catch((err: unknown) => {
        if (err instanceof RollboxError && err.code === 'not_found') return undefined;
        throw err;
      });
      if (read && !read.tar) out[file] = read.body.toString('base64');
    }
    return out;
  }
}
