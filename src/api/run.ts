import { z } from 'zod';
import { ExecRequest } from './exec.ts';
import { CreateSandboxRequest } from './sandbox.ts';

/** A path inside the sandbox: absolute, or relative to the run's workdir; never climbing out with `..`. */
const RunFilePath = z
  .string()
  .min(1)
  .max(4096)
  .refine((p) => !p.includes('\0') && !p.split('/').includes('..'), 'must not contain NUL or ..');

/**
 * One command in a fresh sandbox (from a warm pool when one matches), discarded after:
 * nothing is shared between calls. `files` (path -> base64 content) are written first.
 */
export const RunRequest = z
  .strictObject({
    image: CreateSandboxRequest.shape.image,
    resources: CreateSandboxRequest.shape.resources,
    class: CreateSandboxRequest.shape.class,
    network: CreateSandboxRequest.shape.network,
    argv: ExecRequest.shape.argv,
    cmd: ExecRequest.shape.cmd,
    stdin: ExecRequest.shape.stdin,
    env: ExecRequest.shape.env,
    /** The command's working directory; relative `files` paths are under it. */
    workdir: CreateSandboxRequest.shape.workdir.default('/tmp'),
    files: z.record(RunFilePath, z.base64()).default({}),
    /** Files read back after the command (absolute, or under workdir): in the answer's `files`, as base64; missing ones are left out. */
    fetch: z.array(RunFilePath).max(256).default([]),
    /** The command's limit; the sandbox is discarded when it ends. Default 30 s. */
    timeoutMs: z.number().int().min(1).max(3600 * 1000).default(30_000),
  })
  .refine((r) => (r.argv === undefined) !== (r.cmd === undefined), 'give exactly one of argv and cmd');
export type RunRequest = z.infer<typeof RunRequest>;

/**
 * Four failure classes kept apart: `ok` (exit 0), `failed` (the command exited non-zero:
 * the caller's), `timeout` (it ran past timeoutMs), `infra_error` (the platform failed:
 * never the caller's fault, safe to retry; `error` says what).
 */
export const RunStatus = z.enum(['ok', 'failed', 'timeout', 'infra_error']);
export type RunStatus = z.infer<typeof RunStatus>;

export const RunResult = z.object({
  status: RunStatus,
  /** Null when the command did not run to an exit (infra_error). */
  exitCode: z.number().int().nullable(),
  stdout: z.string(),
  stderr: z.string(),
  truncated: z.boolean(),
  oomKilled: z.boolean(),
  /** The command's own run time. */
  durationMs: z.number(),
  /** The whole call: sandbox, files, command, discard. */
  totalMs: z.number(),
  sandboxId: z.string().optional(),
  /** The fetched files (the request's paths as given -> base64). */
  files: z.record(z.string(), z.string()).default({}),
  /** The warm pool the sandbox came from. */
  pool: z.string().optional(),
  error: z.object({ code: z.string(), message: z.string() }).optional(),
});
export type RunResult = z.infer<typeof RunResult>;
