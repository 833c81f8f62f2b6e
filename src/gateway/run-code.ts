import { RollboxError, RunRequest, type RunCodeLanguage, type RunCodeRequest, type RunCodeResponse, type RunResult } from '../api/index.ts';
import type { Principal } from '../iam/index.ts';
import type { RunService } from './run-service.ts';

/** Where the code and its files go; the command runs there (as SandboxFusion's temp dir). */
const CODE_DIR = '/tmp/code';

/**
 * bytedance/SandboxFusion's `run_code` on top of the function-call tier, so a verl config
 * switches to rollbox by its sandbox URL alone: the code is written as the language's file
 * beside the request's files, run by the language's interpreter with `run_timeout`, in a
 * fresh sandbox of the language's image (a warm pool's when one matches). Interpreted
 * languages only: `compile_result` is null and `compile_timeout` unused, as in SandboxFusion.
 */
export async function runCode(runs: Pick<RunService, 'run'>, principal: Principal, request: RunCodeRequest, languages: Readonly<Record<string, RunCodeLanguage>>): Promise<RunCodeResponse> {
  const language = languages[request.language];
  if (!language) throw new RollboxError('invalid_request', `language ${JSON.stringify(request.language)} is not configured on this gateway (configured: ${Object.keys(languages).sort().join(', ')}; see ROLLBOX_RUN_CODE_LANGUAGES)`);
  const files = Object.fromEntries(Object.entries(request.files).filter((e): e is [string, string] => e[1] !== null && !e[0].includes('IGNORE_THIS_FILE')));
  const parsed = RunRequest.safeParse({
    image: language.image,
    argv: [...language.argv, language.file],
    stdin: request.stdin ?? undefined,
    files: { ...files, [language.file]: Buffer.from(request.code).toString('base64') },
    fetch: request.fetch_files,
    workdir: CODE_DIR,
    timeoutMs: Math.max(1, Math.round(request.run_timeout * 1000)),
    resources: { memoryMiB: request.memory_limit_MB > 0 ? Math.max(8, request.memory_limit_MB) : language.memoryMiB },
  });
  if (!parsed.success) throw new RollboxError('invalid_request', `run_code: ${parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`);
  return toRunCodeResponse(await runs.run(principal, parsed.data));
}

/** A run's outcome in SandboxFusion's terms (timeouts in seconds; a time limit is `Failed`, the platform's failures `SandboxError`). */
export function toRunCodeResponse(result: RunResult): RunCodeResponse {
  const ran = result.status !== 'infra_error';
  return {
    status: result.status === 'ok' ? 'Success' : ran ? 'Failed' : 'SandboxError',
    message: ran ? '' : `${result.error?.code ?? 'internal'}: ${result.error?.message ?? 'the sandbox failed'}`,
    compile_result: null,
    run_result: ran ? { status: result.status === 'timeout' ? 'TimeLimitExceeded' : 'Finished', execution_time: result.durationMs / 1000, return_code: result.exitCode, stdout: result.stdout, stderr: result.stderr } : null,
    executor_pod_name: result.sandboxId ?? null,
    files: result.files,
  };
}
