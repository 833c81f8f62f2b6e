import { z } from 'zod';
import { ImageSpec } from './sandbox.ts';

/**
 * bytedance/SandboxFusion's `POST /run_code`, as verl and other SandboxFusion clients
 * send it (timeouts in seconds). Unknown fields are ignored, as SandboxFusion does.
 */
export const RunCodeRequest = z.object({
  code: z.string().max(8 * 1024 * 1024),
  /** Defaults to python (some clients send only `code`). */
  language: z.string().max(64).default('python'),
  compile_timeout: z.number().positive().max(3600).default(10),
  run_timeout: z.number().positive().max(3600).default(10),
  /** -1: the language's default memory. */
  memory_limit_MB: z.number().int().default(-1),
  stdin: z.string().max(8 * 1024 * 1024).nullable().default(null),
  /** path (relative to the code's directory, or absolute) -> base64 content; null entries are skipped. */
  files: z.record(z.string().max(4096), z.string().nullable()).default({}),
  fetch_files: z.array(z.string().max(4096)).max(256).default([]),
});
export type RunCodeRequest = z.infer<typeof RunCodeRequest>;

export const CommandRunResult = z.object({
  status: z.enum(['Finished', 'Error', 'TimeLimitExceeded']),
  /** Seconds. */
  execution_time: z.number().nullable(),
  return_code: z.number().int().nullable(),
  stdout: z.string().nullable(),
  stderr: z.string().nullable(),
});
export type CommandRunResult = z.infer<typeof CommandRunResult>;

/** `Success` (exit 0), `Failed` (non-zero exit or time limit: the code's), `SandboxError` (the platform failed: retry). */
export const RunCodeResponse = z.object({
  status: z.enum(['Success', 'Failed', 'SandboxError']),
  message: z.string(),
  compile_result: CommandRunResult.nullable(),
  run_result: CommandRunResult.nullable(),
  executor_pod_name: z.string().nullable(),
  files: z.record(z.string(), z.string()),
});
export type RunCodeResponse = z.infer<typeof RunCodeResponse>;

/** How one language runs: the image, and the command the code file is given to. */
export const RunCodeLanguage = z.strictObject({
  image: ImageSpec,
  /** The interpreter; the code file's path is appended. */
  argv: z.array(z.string()).min(1),
  /** The code file's name (its extension matters to some interpreters). */
  file: z.string().regex(/^[A-Za-z0-9_.-]{1,64}$/),
  /** Memory when the request gives none (memory_limit_MB -1). */
  memoryMiB: z.number().int().min(8).default(512),
});
export type RunCodeLanguage = z.infer<typeof RunCodeLanguage>;
