import path from 'node:path';
import { FILES_BYTES_TYPE, RollboxError, type BatchOptions, type BatchTask, type ErrorCode, type ExecResult, type RolloutOutcome, type StepResult } from '../../api/index.ts';
import type { Principal } from '../../iam/index.ts';
import { whileRedisAway } from '../../redis/index.ts';
import type { AttemptSandboxes, BatchStore, ResultLineInput } from '../../registry/index.ts';
import type { Span } from '../../rollouts/index.ts';
import { AGENT_NETWORK, agentCommandIdOf, prepareRollout, rolloutIdOf, rolloutOutcome, runAgentCommand, type RolloutDeps } from './agent.ts';
import { gradeInFreshSandbox, gradeInPlace, type GradeDeps } from './grade.ts';

export interface TaskDeps extends GradeDeps {
  store: Pick<BatchStore, 'attemptSandbox' | 'recordAttemptSandbox'>;
  rollouts: RolloutDeps;
}

/** What running one task came to: a result to record, or a reason to queue it again. */
export type TaskOutcome =
  | { kind: 'result'; line: ResultLineInput }
  /** The platform failed: retried while attempts remain, then `infra_error`. */
  | { kind: 'infra'; error: { code: string; message: string }; steps: StepResult[] }
  /** No room now (quota, capacity): queued again, the attempt not charged. */
  | { kind: 'backpressure'; error: { code: string; message: string } }
  /**
   * Stopped from outside (the batch cancelled, the gateway stopping): the runner decides. A
   * rollout the cancel ended (TaskCancelled) carries its outcome, its times up to the cancel.
   */
  | { kind: 'aborted'; steps: StepResult[]; rollout?: RolloutOutcome };

/**
 * The abort reason of a task whose batch is cancelled (or expired): its rollout ends there,
 * so its times are computed then. Any other abort (the gateway stopping) leaves the rollout
 * to go on under a later attempt.
 */
export class TaskCancelled extends Error {}

/** Everything a batch's task may do in its sandboxes, granted by the submitter's `batch:submit`. */
const TASK_SCOPES = new Set(['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:policy'] as const);
/** At create: no room now, or none in time (a create nobody picked up: `timeout`). */
const BACKPRESSURE: ReadonlySet<ErrorCode> = new Set(['quota_exceeded', 'no_capacity', 'admission_exhausted', 'network_unavailable', 'unavailable', 'timeout']);
/** At create or when writing the task's files: the task's own input is wrong (never retried). */
const TASK_INPUT_ERRORS: ReadonlySet<ErrorCode> = new Set(['invalid_request', 'not_found', 'invalid_layer', 'invalid_archive', 'payload_too_large', 'forbidden']);
const TTL_MARGIN_SEC = 300;
/** How long a rollout's outcome is read again while Redis fails over. */
const OUTCOME_RETRY_MS = 60_000;

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
async function resumePrevious(deps: TaskDeps, acting: Principal, run: TaskRun, previous: AttemptSandboxes) {
  const log = await deps.execs.commandLog(acting, previous.sandboxId, 1000).catch(() => []);
  const sandbox = await deps.sandboxes.get(acting, previous.sandboxId).catch(() => undefined);
  if (run.task.agent) {
    // A hosted rollout goes on where it was: its agent's command still runs (or ended) in its
    // sandbox, and the same command id waits for it. Without both sandboxes it starts over.
    const agentSandbox = previous.agentSandboxId && (await deps.sandboxes.get(acting, previous.agentSandboxId).catch(() => undefined));
    if (sandbox?.state !== 'running' || !agentSandbox || agentSandbox.state !== 'running') return dropPrevious(deps, acting, previous);
  }
  const byId = new Map(log.map((c) => [c.commandId, c]));
  const steps: StepResult[] = [];
  let status: 'succeeded' | 'failed' | 'timeout' = 'succeeded';
  for (let i = 0; i < run.task.steps.length && status === 'succeeded'; i++) {
    const c = byId.get(stepCommandId(run, previous.attempt, i));
    if (c?.state !== 'done' || !c.result) return dropPrevious(deps, acting, previous);
    steps.push(stepOf({ ...c.result, replayed: false }));
    if (c.result.timedOut || c.result.exitCode !== 0) status = c.result.timedOut ? 'timeout' : 'failed';
  }
  if (previous.agentSandboxId) return { sandboxId: previous.sandboxId, agentSandboxId: previous.agentSandboxId, attempt: previous.attempt, steps, status, lost: false } as const;
  if (run.task.grade && sandbox?.state !== 'running') {
    // The steps completed but their sandbox is gone: there is nothing left to grade.
    return { sandboxId: undefined, steps, status, lost: true } as const;
  }
  return { sandboxId: previous.sandboxId, attempt: previous.attempt, steps, status, lost: false } as const;
}

/** A previous attempt that cannot go on: its sandboxes go, and the task starts over. */
async function dropPrevious(deps: TaskDeps, acting: Principal, previous: AttemptSandboxes): Promise<undefined> {
  await Promise.all([previous.sandboxId, previous.agentSandboxId].filter((id) => id !== undefined).map((id) => deps.sandboxes.delete(acting, id).catch(() => undefined)));
  return undefined;
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
  const stepsMs = task.steps.reduce((s, x) => s + x.timeoutMs, 0) + (task.agent?.timeoutMs ?? 0) + (task.grade?.timeoutMs ?? 0);
  const ttlSeconds = Math.ceil(stepsMs / 1000) + TTL_MARGIN_SEC;
  // The task's, else its image's WorkingDir (known once the sandbox is created): relative file paths resolve against it.
  let workdir = task.workdir ?? '/';
  /** A rollout's creates, requested to running: its environment wait. */
  const envWaits: Span[] = [];
  const create = async (image: BatchTask['image'], role: 'steps' | 'agent' | 'grade', hiddenPaths: string[]): Promise<string> => {
    const agent = role === 'agent' ? task.agent : undefined;
    const requestedAtMs = deps.now();
    const { sandbox } = await deps.sandboxes.create(
      acting,
      {
        image,
        resources: agent?.resources ?? task.resources,
        class: options.class,
        network: role === 'steps' ? task.network : role === 'agent' ? AGENT_NETWORK : (task.grade?.network ?? { mode: 'none', allow: [] }),
        hiddenPaths,
        env: agent ? {} : task.env,
        ...(agent ? {} : { workdir: task.workdir }),
        // A rollout's sandboxes carry its training job: pausing the job pauses them.
        ...(task.model && role !== 'grade' ? { job: task.model.job } : {}),
        labels: { 'rollbox.batch': run.batchId, 'rollbox.task': run.customId, 'rollbox.role': role },
        ttlSeconds,
      },
      `${run.batchId}.${run.customId}.${run.attempt}.${role}`,
    );
    made.push(sandbox.id);
    if (role !== 'grade') envWaits.push({ fromMs: requestedAtMs, toMs: deps.now() });
    if (role === 'steps') workdir = sandbox.spec.workdir ?? workdir;
    if (run.signal.aborted) throw run.signal.reason;
    return sandbox.id;
  };
  /** A step that only waits or reads, tried again while Redis fails over (failing the attempt would delete its sandboxes), until `untilMs` or the task is stopped. */
  const throughFailover = (untilMs: number) => ({ untilMs, now: deps.now, stopped: () => run.signal.aborted, onWait: () => undefined });
  /** When the task was stopped from outside: a cancelled rollout ended then. */
  let abortedAtMs: number | undefined;
  const onAbort = () => {
    abortedAtMs = deps.now();
    void Promise.all(made.map((id) => deps.sandboxes.delete(acting, id).catch(() => undefined)));
  };
  run.signal.addEventListener('abort', onAbort, { once: true });
  let stage: 'input' | 'steps' = 'input';
  let rolloutId: string | undefined;
  /** The rollout's outcome, computed once: when its agent exits, or at the cancel that ended it. */
  let rollout: RolloutOutcome | undefined;
  const aborted = async (agentEndedAtMs = Infinity): Promise<TaskOutcome> => {
    // It ended at the cancel, or before it if its agent had exited first.
    if (rolloutId && !rollout && run.signal.reason instanceof TaskCancelled) rollout = await rolloutOutcome(deps.rollouts, rolloutId, Math.min(agentEndedAtMs, abortedAtMs ?? deps.now()));
    return { kind: 'aborted', steps, ...(rollout ? { rollout } : {}) };
  };
  try {
    const previous = await deps.store.attemptSandbox(run.batchId, run.customId);
    const resumed = previous ? await resumePrevious(deps, acting, run, previous) : undefined;
    if (resumed?.lost) {
      return { kind: 'result', line: { customId: run.customId, status: 'infra_error', steps: resumed.steps, attempts: run.attempt, error: { code: 'node_lost', message: 'the steps completed, but their sandbox was lost before the grade' } } };
    }
    let sandboxId: string;
    let agentSandboxId: string | undefined;
    let status: 'succeeded' | 'failed' | 'timeout' = 'succeeded';
    if (resumed?.sandboxId) {
      sandboxId = resumed.sandboxId;
      made.push(sandboxId);
      if (resumed.agentSandboxId) made.push((agentSandboxId = resumed.agentSandboxId));
      steps.push(...resumed.steps);
      status = resumed.status;
      stage = 'steps';
    } else {
      // A rollout's agent sandbox is made beside its task's, at the same time (neither waits for
      // the other's start), so no room for it is backpressure too. Both settle before an error
      // is thrown: whichever was made is in `made`, and deleted below.
      const [taskMade, agentMade] = await Promise.allSettled([create(task.image, 'steps', task.hiddenPaths), task.agent ? create(task.agent.image ?? task.image, 'agent', []) : undefined]);
      if (taskMade.status === 'rejected') throw taskMade.reason;
      if (agentMade.status === 'rejected') throw agentMade.reason;
      sandboxId = taskMade.value;
      agentSandboxId = agentMade.value;
      await deps.store.recordAttemptSandbox(run.batchId, run.customId, { sandboxId, attempt: run.attempt, ...(agentSandboxId ? { agentSandboxId } : {}) });
      for (const [file, content] of Object.entries(task.files)) {
        await deps.files.write(acting, sandboxId, { path: path.posix.resolve(workdir, file) }, Buffer.from(content, 'base64'), FILES_BYTES_TYPE);
      }
      stage = 'steps';
      for (const [i, step] of task.steps.entries()) {
        if (run.signal.aborted) return await aborted();
        const r = await deps.execs.exec(acting, sandboxId, { ...step, background: false, commandId: stepCommandId(run, run.attempt, i) });
        steps.push(stepOf(r));
        if (r.timedOut || r.exitCode !== 0) {
          status = r.timedOut ? 'timeout' : 'failed';
          break;
        }
      }
    }
    const line: ResultLineInput = { customId: run.customId, status, steps, attempts: run.attempt, sandboxId };
    if (task.agent && task.model && agentSandboxId && status === 'succeeded' && !run.signal.aborted) {
      // The attempt that made its sandboxes names the rollout (a resumed one goes on under it).
      const attempt = resumed?.attempt ?? run.attempt;
      rolloutId = rolloutIdOf(run.batchId, run.customId, attempt);
      const commandId = agentCommandIdOf(run.batchId, attempt);
      const started = resumed && (await deps.execs.commandLog(acting, agentSandboxId, 1000)).some((c) => c.commandId === commandId);
      const { env } = started ? { env: {} } : await prepareRollout(deps.rollouts, { tenant: run.tenant, job: task.model.job, batchId: run.batchId, customId: run.customId, attempt, taskSandboxId: sandboxId, agentSandboxId, agent: task.agent, limits: task.limits, ttlSeconds, now: deps.now(), envWaits });
      // Sent again with the same command id, the agent's command is waited on, not run twice.
      const r = await whileRedisAway(() => runAgentCommand(deps.execs, acting, agentSandboxId!, task.agent!, env, commandId), throughFailover(deps.now() + task.agent.timeoutMs));
      const agentEndedAtMs = deps.now();
      // An agent whose sandbox the cancel deleted did not exit on its own: the rollout ended at the cancel.
      if (run.signal.aborted) return await aborted(agentEndedAtMs);
      line.agent = stepOf(r);
      line.rollout = rollout = await whileRedisAway(() => rolloutOutcome(deps.rollouts, rolloutId!, agentEndedAtMs), throughFailover(deps.now() + OUTCOME_RETRY_MS));
      if (r.timedOut || r.exitCode !== 0) line.status = r.timedOut ? 'timeout' : 'failed';
    }
    const grade = task.grade;
    if (grade && !run.signal.aborted) {
      const graded =
        grade.mode === 'same-sandbox'
          ? await gradeInPlace(deps, acting, sandboxId, grade)
          : (await gradeInFreshSandbox(deps, acting, sandboxId, task, grade, (image) => create(image, 'grade', []))).result;
      line.grade = { ...stepOf(graded), mode: grade.mode, passed: !graded.timedOut && graded.exitCode === 0 };
    }
    if (run.signal.aborted) return await aborted();
    return { kind: 'result', line };
  } catch (err) {
    if (run.signal.aborted) return await aborted();
    const error = err instanceof RollboxError ? { code: err.code, message: err.message } : { code: 'internal', message: String(err) };
    if (err instanceof RollboxError && BACKPRESSURE.has(err.code) && stage === 'input') return { kind: 'backpressure', error };
    if (err instanceof RollboxError && TASK_INPUT_ERRORS.has(err.code) && stage === 'input') {
      return { kind: 'result', line: { customId: run.customId, status: 'failed', steps, attempts: run.attempt, error } };
    }
    return { kind: 'infra', error, steps };
  } finally {
    run.signal.removeEventListener('abort', onAbort);
    if (rolloutId) await deps.rollouts.keys.revoke(rolloutId).catch(() => undefined);
    await Promise.all(made.map((id) => deps.sandboxes.delete(acting, id).catch(() => undefined)));
  }
}
