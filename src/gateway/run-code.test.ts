import { describe, expect, it } from 'vitest';
import type { RunResult } from '../api/index.ts';
import { toRunCodeResponse } from './run-code.ts';

const base: RunResult = { status: 'ok', exitCode: 0, stdout: 'out', stderr: 'err', truncated: false, oomKilled: false, durationMs: 1500, totalMs: 1600, sandboxId: 'sbx_a', files: { 'o.txt': 'eA==' } };

describe('run_code answers (SandboxFusion)', () => {
  it('maps the four run classes onto Success, Failed and SandboxError', () => {
    expect(toRunCodeResponse(base)).toEqual({
      status: 'Success',
      message: '',
      compile_result: null,
      run_result: { status: 'Finished', execution_time: 1.5, return_code: 0, stdout: 'out', stderr: 'err' },
      executor_pod_name: 'sbx_a',
      files: { 'o.txt': 'eA==' },
    });
    expect(toRunCodeResponse({ ...base, status: 'failed', exitCode: 1 })).toMatchObject({ status: 'Failed', run_result: { status: 'Finished', return_code: 1 } });
    expect(toRunCodeResponse({ ...base, status: 'timeout', exitCode: null })).toMatchObject({ status: 'Failed', run_result: { status: 'TimeLimitExceeded', return_code: null } });
    const infra = toRunCodeResponse({ ...base, status: 'infra_error', exitCode: null, stdout: '', stderr: '', sandboxId: undefined, files: {}, error: { code: 'no_capacity', message: 'full' } });
    expect(infra).toMatchObject({ status: 'SandboxError', message: 'no_capacity: full', run_result: null, executor_pod_name: null });
  });
});
