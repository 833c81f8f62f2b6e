import path from 'node:path';
import { FILES_BYTES_TYPE, RollboxError, type BatchOptions, type BatchTask, type ErrorCode, type ExecResult, type StepResult } from '../../api/index.ts';
import type { Principal } from '../../iam/index.ts';
import type { BatchStore, ResultLineInput } from '../../registry/index.ts';
import { gradeInFreshSandbox, gradeInPlace, type GradeDeps } from './grade.ts';

export interface TaskDeps extends GradeDeps {
  store: Pick<BatchStore, 'attemptSandbox' | 'recordAttemptSandbox'>;
}

/** What running one task came to: a result to record, or a reason to queue it again. */
export type TaskOutcome =
  | { kind: 'result'; line: ResultLineInput }
  /** The platform failed: retried while attempts remain, then `infra_error`. */
  | { kind: 'infra'; error: { code: string; message: string }; steps: StepResult[] }
  /** No room now (quota, capacity): queued again, the attempt not charged. */
  | { kind: 'backpressure'; error: { code: string; message: string } }
  /** Stopped from outside (the batch cancelled, the gateway stopping): the runner decides. */
  | { kind: 'aborted'; steps: StepResult[] };

/** Everything a batch's task may do in its sandboxes, granted by the submitter's `batch:submit`. */
const TASK_SCOPES = new Set(['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:policy'] as const);
/** At create: no room now, or none in time (a create nobody picked up: `timeout`). */
const BACKPRESSURE: ReadonlySet<ErrorCode> = new Set(['quota_exceeded', 'no_capacity', 'admission_exhausted', 'network_unavailable', 'unavailable', 'timeout']);
/** At create or when writing the task's files: the task's own input is wrong (never retried). */
const TASK_INPUT_ERRORS: ReadonlySet<ErrorCode> = new Set(['invalid_request', 'not_found', 'invalid_layer', 'invalid_archive', 'payload_too_large', 'forbidden']);
const TTL_MARGIN_SEC = 300;

export interface TaskRun {
  batchId: string;
  tenant: string;
  options: BatchOptions;
  customId: string;
  attempt: number;
  task: BatchTask;
  signal: AbortSignal;
}

const stepCommandId = (run: Pick<TaskRun, 'batchId'>, attempt: number, i: number) => `${run.batchId}.${attempt}.s${i}`;

/**
 * A previous attempt whose runner died: when every step it needed is recorded done in its
 * sandbox's command log (the runner died after the steps, before recording the task), its
 * results are taken as they are and its sandbox (still running) goes on to the grade, so
 * no step runs to completion twice. Otherwise its sandbox is deleted and the task starts over.
 */
async function resumePrevious(deps: TaskDeps, acting: Principal, run: TaskRun, previous: { sandboxId: string; attempt: number }) {
  const log = await deps.execs.commandLog(acting, previous.sandboxId, 1000).catch(() => []);
  const sandbox = await deps.sandboxes.get(acting, previous.sandboxId).catch(() => undefined);
  const byId = new Map(log.map((c) => [c.commandId, c]));
  const steps: StepResult[] = [];
  let status: 'succeeded' | 'failed' | 'timeout' = 'succeeded';
  for (let i = 0; i < run.task.steps.length && status === 'succeeded'; i++) {
    const c = byId.get(stepCommandId(run, previous.attempt, i));
    if (c?.state !== 'done' || !c.result) {
      await deps.sandboxes.delete(acting, previous.sandboxId).catch(() => undefined);
      return undefined;
    }
    steps.push(stepOf({ ...c.result, replayed: false }));
    if (c.result.timedOut || c.result.exitCode !== 0) status = c.result.timedOut ? 'timeout' : 'failed';
  }
  if (run.task.grade && sandbox?.state !== 'running') {
    // The steps completed but their sandbox is gone: there is nothing left to grade.
    return { sandboxId: undefined, steps, status, lost: true } as const;
  }
  return { sandboxId: previous.sandboxId, steps, status, lost: false } as const;
}

function stepOf(r: ExecResult): StepResult {
  return { exitCode: r.timedOut ? null : r.exitCode, stdout: r.stdout, stderr: r.stderr, truncated: r.truncated, timedOut: r.timedOut, oomKilled: r.oomKilled, durationMs: r.durationMs };
}

/**
 * Runs one attempt of a task: a sandbox of its image (besteffort unless the batch says
 * otherwise), its files, its steps in order (the first non-zero exit or timeout ends them),
 * then its grade; every sandbox it made is deleted whatever happens. A previous attempt's
 * sandbox (its runner died) is deleted first, so two attempts never run side by side.
 */
export async function runTask(deps: TaskDeps, run: TaskRun): Promise<TaskOutcome> {
  const { task, options } = run;
  const acting: Principal = { tenant: run.tenant, scopes: TASK_SCOPES };
  const made: string[] = [];
  const steps: StepResult[] = [];
  const stepsMs = task.steps.reduce((s, x) => s + x.timeoutMs, 0) + (task.grade?.timeoutMs ?? 0);
  // The task's, else its image's WorkingDir (known once the sandbox is created): relative file paths resolve against it.
  let workdir = task.workdir ?? '/';
  const create = async (image: BatchTask['image'], role: string, hiddenPaths: string[]): Promise<string> => {
    const { sandbox } = await deps.sandboxes.create(
      acting,
      {
        image,
        resources: task.resources,
        class: options.class,
        network: role === 'steps' ? task.network : (task.grade?.network ?? { mode: 'none', allow: [] }),
        hiddenPaths,
        env: task.env,
        workdir: task.workdir,
        labels: { 'rollbox.batch': run.batchId, 'rollbox.task': run.customId, 'rollbox.role': role },
        ttlSeconds: Math.ceil(stepsMs / 1000) + TTL_MARGIN_SEC,
      },
      `${run.batchId}.${run.customId}.${run.attempt}.${role}`,
    );
    made.push(sandbox.id);
    if (role === 'steps') workdir = sandbox.spec.workdir ?? workdir;
    if (run.signal.aborted) throw run.signal.reason;
    return sandbox.id;
  };
  const onAbort = () => void Promise.all(made.map((id) => deps.sandboxes.delete(acting, id).catch(() => undefined)));
  run.signal.addEventListener('abort', onAbort, { once: true });
  let stage: 'input' | 'steps' = 'input';
  try {
    const previous = await deps.store.attemptSandbox(run.batchId, run.customId);
    const resumed = previous ? await resumePrevious(deps, acting, run, previous) : undefined;
    if (resumed?.lost) {
      return { kind: 'result', line: { customId: run.customId, status: 'infra_error', steps: resumed.steps, attempts: run.attempt, error: { code: 'node_lost', message: 'the steps completed, but their sandbox was lost before the grade' } } };
    }
    let sandboxId: string;
    let status: 'succeeded' | 'failed' | 'timeout' = 'succeeded';
    if (resumed?.sandboxId) {
      sandboxId = resumed.sandboxId;
      made.push(sandboxId);
      steps.push(...resumed.steps);
      status = resumed.status;
      stage = 'steps';
    } else {
      sandboxId = await create(task.image, 'steps', task.hiddenPaths);
      await deps.store.recordAttemptSandbox(run.batchId, run.customId, { sandboxId, attempt: run.attempt });
      for (const [file, content] of Object.entries(task.files)) {
        await deps.files.write(acting, sandboxId, { path: path.posix.resolve(workdir, file) }, Buffer.from(content, 'base64'), FILES_BYTES_TYPE);
      }
      stage = 'steps';
      for (const [i, step] of task.steps.entries()) {
        if (run.signal.aborted) return { kind: 'aborted', steps };
        const r = await deps.execs.exec(acting, sandboxId, { ...step, background: false, commandId: stepCommandId(run, run.attempt, i) });
        steps.push(stepOf(r));
        if (r.timedOut || r.exitCode !== 0) {
          status = r.timedOut ? 'timeout' : 'failed';
          break;
        }
      }
    }
    const line: ResultLineInput = { customId: run.customId, status, steps, attempts: run.attempt, sandboxId };
    const grade = task.grade;
    if (grade && !run.signal.aborted) {
      const graded =
        grade.mode === 'same-sandbox'
          ? await gradeInPlace(deps, acting, sandboxId, grade)
          : (await gradeInFreshSandbox(deps, acting, sandboxId, task, grade, (image) => create(image, 'grade', []))).result;
      line.grade = { ...stepOf(graded), mode: grade.mode, passed: !graded.timedOut && graded.exitCode === 0 };
    }
    if (run.signal.aborted) return { kind: 'aborted', steps };
    return { kind: 'result', line };
  } catch (err) {
    if (run.signal.aborted) return { kind: 'aborted', steps };
    const error = err instanceof RollboxError ? { code: err.code, message: err.message } : { code: 'internal', message: String(err) };
    if (err instanceof RollboxError && BACKPRESSURE.has(err.code) && stage === 'input') return { kind: 'backpressure', error };
    if (err instanceof RollboxError && TASK_INPUT_ERRORS.has(err.code) && stage === 'input') {
      return { kind: 'result', line: { customId: run.customId, status: 'failed', steps, attempts: run.attempt, error } };
    }
    return { kind: 'infra', error, steps };
  } finally {
    run.signal.removeEventListener('abort', onAbort);
    await Promise.all(made.map((id) => deps.sandboxes.delete(acting, id).catch(() => undefined)));
  }
}
