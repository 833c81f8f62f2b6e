import { z } from 'zod';
import { ExecRequest, ExecResult } from './exec.ts';
import { RolloutAgent, RolloutLimits, RolloutModel, RolloutOutcome, RolloutRecord, Trajectory } from './rollout.ts';
import { CreateSandboxRequest, LayerRef, NetworkPolicy } from './sandbox.ts';

const AbsolutePath = CreateSandboxRequest.shape.workdir.unwrap();
/** A path inside the sandbox: absolute, or relative to the task's workdir; never climbing out with `..`. */
const TaskFilePath = z
  .string()
  .min(1)
  .max(4096)
  .refine((p) => !p.includes('\0') && !p.split('/').includes('..'), 'must not contain NUL or ..');
const Command = { argv: ExecRequest.shape.argv, cmd: ExecRequest.shape.cmd };
const oneCommand = (s: { argv?: unknown; cmd?: unknown }) => (s.argv === undefined) !== (s.cmd === undefined);

export const BatchStep = z
  .strictObject({
    ...Command,
    stdin: ExecRequest.shape.stdin,
    env: ExecRequest.shape.env,
    cwd: ExecRequest.shape.cwd,
    timeoutMs: z.number().int().min(1).max(3600 * 1000).default(60_000),
  })
  .refine(oneCommand, 'give exactly one of argv and cmd');
export type BatchStep = z.infer<typeof BatchStep>;

/**
 * The grade: a command run after the steps, whose exit status and output the platform
 * records (nothing the steps write can stand in for them).
 * - `fresh-sandbox`: a new sandbox of the task's image, then a layer of what the steps left
 *   at `collect` (copied out of their sandbox), then the grader's `layers` on top, so grader
 *   files win over the agent's at the same path and nothing else the steps changed reaches it.
 * - `same-sandbox`: a new stage of the steps' sandbox: every process they left is killed,
 *   the task's hidden paths are revealed (`hiddenPaths` of the grade stage, default none) and
 *   the network changed (`network`, default none). Faster; trusts the binaries the steps
 *   could have replaced.
 */
export const BatchGrade = z
  .strictObject({
    mode: z.enum(['fresh-sandbox', 'same-sandbox']).default('fresh-sandbox'),
    ...Command,
    env: ExecRequest.shape.env,
    cwd: ExecRequest.shape.cwd,
    timeoutMs: z.number().int().min(1).max(3600 * 1000).default(300_000),
    /** fresh-sandbox: the grader's layers, stacked over the task's image and the collected output. */
    layers: z.array(LayerRef).max(8).default([]),
    /** fresh-sandbox: the task's output, copied from the steps' sandbox (absolute directories or files). */
    collect: z.array(AbsolutePath).max(32).default([]),
    /** same-sandbox: the hidden paths while grading (the task's are revealed unless listed here). */
    hiddenPaths: z.array(AbsolutePath).max(256).default([]),
    /** same-sandbox: the network while grading. */
    network: NetworkPolicy.default({ mode: 'none', allow: [] }),
  })
  .refine(oneCommand, 'give exactly one of argv and cmd');
export type BatchGrade = z.infer<typeof BatchGrade>;

export const BatchTask = z
  .strictObject({
  /** The task's name, unique in its batch: results are keyed by it. */
  customId: z.string().regex(/^[A-Za-z0-9_.:-]{1,128}$/, 'customId is [A-Za-z0-9_.:-]{1,128}'),
  image: CreateSandboxRequest.shape.image,
  resources: CreateSandboxRequest.shape.resources,
  network: CreateSandboxRequest.shape.network,
  hiddenPaths: CreateSandboxRequest.shape.hiddenPaths,
  env: CreateSandboxRequest.shape.env,
  workdir: CreateSandboxRequest.shape.workdir,
  /** Written before the first step: path (absolute, or under workdir) -> base64 content. */
  files: z.record(TaskFilePath, z.base64()).default({}),
  /** Fixed commands, run first (the first non-zero exit or timeout ends the task). */
  steps: z.array(BatchStep).max(100).default([]),
  /** A hosted rollout: the agent, run after the steps in its own sandbox, driving the task's sandbox and its model through the gateway. */
  agent: RolloutAgent.optional(),
  /** The agent's model: the job whose upstreams its calls go to. Needed with `agent`. */
  model: RolloutModel.optional(),
  limits: RolloutLimits.optional(),
  grade: BatchGrade.optional(),
})
  .refine((t) => t.steps.length > 0 || t.agent !== undefined, { message: 'a task needs steps, an agent, or both', path: ['steps'] })
  .refine((t) => (t.agent === undefined) === (t.model === undefined), { message: 'agent and model go together', path: ['model'] });
export type BatchTask = z.infer<typeof BatchTask>;

export const BatchOptions = z.strictObject({
  /** Sandboxes of this batch at once (across the cluster). */
  maxConcurrency: z.coerce.number().int().min(1).max(10_000).default(16),
  /** Tries of a task whose platform failed (infra_error); a step's non-zero exit is never retried. */
  maxAttempts: z.coerce.number().int().min(1).max(10).default(3),
  /** Tasks not finished this long after the submit end `cancelled` and the batch `expired`. */
  completionWindowSeconds: z.coerce.number().int().min(1).max(30 * 86_400).default(86_400),
  /** besteffort by default: batch work never slows trainers' latency-class sandboxes. */
  class: z.enum(['latency', 'besteffort']).default('besteffort'),
  metadata: z.record(z.string().max(64), z.string().max(512)).default({}),
  /** Refuse the batch (`invalid_state`) unless every task's image has passed its check (`POST /v1/images/:name/check`). */
  requireValidated: z.union([z.boolean(), z.enum(['true', 'false']).transform((v) => v === 'true')]).optional(),
});
export type BatchOptions = z.infer<typeof BatchOptions>;

export const CreateBatchRequest = BatchOptions.extend({ tasks: z.array(BatchTask).min(1).max(50_000) });

/**
 * `POST /v1/rollouts`: one hosted rollout (a task with `agent`), run as a batch of one: its
 * queueing, attempts, results and grading are a batch's; the answer is that batch.
 */
export const CreateRolloutRequest = BatchOptions.extend({
  task: BatchTask.refine((t) => t.agent !== undefined, { message: 'a rollout needs an agent', path: ['agent'] }),
});
export type CreateRolloutRequest = z.infer<typeof CreateRolloutRequest>;
export type CreateBatchRequest = z.infer<typeof CreateBatchRequest>;

/** Options of an NDJSON submit (the body is the tasks, one per line). */
export const BatchSubmitQuery = BatchOptions.omit({ metadata: true }).extend({
  /** JSON object of string values. */
  metadata: z.string().max(16_384).optional(),
});

export const BatchState = z.enum(['validating', 'in_progress', 'finalizing', 'completed', 'cancelling', 'cancelled', 'failed', 'expired']);
export type BatchState = z.infer<typeof BatchState>;
export const TERMINAL_BATCH_STATES: readonly BatchState[] = ['completed', 'cancelled', 'failed', 'expired'];

export const TaskStatus = z.enum(['succeeded', 'failed', 'timeout', 'infra_error', 'cancelled']);
export type TaskStatus = z.infer<typeof TaskStatus>;

export const BatchCounts = z.object({
  total: z.number().int(),
  queued: z.number().int(),
  running: z.number().int(),
  succeeded: z.number().int(),
  failed: z.number().int(),
  timeout: z.number().int(),
  infra_error: z.number().int(),
  cancelled: z.number().int(),
});
export type BatchCounts = z.infer<typeof BatchCounts>;

export const Batch = z.object({
  id: z.string(),
  tenant: z.string(),
  state: BatchState,
  options: BatchOptions,
  counts: BatchCounts,
  /** When it entered each state it has been in (ISO 8601). */
  timestamps: z.partialRecord(BatchState, z.string()),
  createdAt: z.string(),
  expiresAt: z.string(),
  error: z.object({ code: z.string(), message: z.string() }).optional(),
});
export type Batch = z.infer<typeof Batch>;
export const BatchList = z.object({ batches: z.array(Batch) });

/** A step's (or the grade's) command as it ended; exitCode null when it timed out. */
export const StepResult = ExecResult.pick({ stdout: true, stderr: true, truncated: true, timedOut: true, oomKilled: true, durationMs: true }).extend({ exitCode: z.number().int().nullable() });
export type StepResult = z.infer<typeof StepResult>;

/** One line of a batch's results: a task that ended. */
export const BatchResultLine = z.object({
  customId: z.string(),
  status: TaskStatus,
  steps: z.array(StepResult),
  /** The agent's command (a hosted rollout), when it ran. */
  agent: StepResult.optional(),
  rollout: RolloutOutcome.optional(),
  grade: StepResult.extend({ mode: BatchGrade.shape.mode, passed: z.boolean() }).optional(),
  attempts: z.number().int(),
  sandboxId: z.string().optional(),
  /** Why the platform (infra_error), the task's input (failed before a step ran) or a cancel ended it. */
  error: z.object({ code: z.string(), message: z.string() }).optional(),
  /** Resume reading after this line: `?after=<cursor>`. */
  cursor: z.string(),
  endedAt: z.string(),
});
export type BatchResultLine = z.infer<typeof BatchResultLine>;

export const BatchResultsQuery = z.strictObject({
  after: z.string().regex(/^\d+-\d+$/).optional(),
  limit: z.coerce.number().int().min(1).max(10_000).default(1000),
  /** Long-poll: with nothing new yet, wait up to this many seconds for a line (or the batch's end). */
  waitSeconds: z.coerce.number().min(0).max(60).default(0),
});

/**
 * GET /v1/batches/:id/events: from `after` (or the `Last-Event-ID` header, which wins: a
 * reconnecting EventSource sends it). `trajectory=true` sends each ended task as a `rollout`
 * event carrying its rollout's trajectory (FollowedRollout) instead of a `result` event.
 */
export const BatchEventsQuery = z.strictObject({
  after: BatchResultsQuery.shape.after,
  trajectory: z.enum(['true', 'false']).default('false').transform((v) => v === 'true'),
});

/**
 * One finished task of a batch as a trainer takes it in: its result line and, when it ran an
 * agent that started, its rollout's trajectory (read once the task had ended). The line's
 * `cursor` resumes after it. A `rollout` event's data, and a line of `rollbox rollout follow`.
 */
export const FollowedRollout = z.object({ line: BatchResultLine, trajectory: Trajectory.optional() });
export type FollowedRollout = z.infer<typeof FollowedRollout>;

/** Where one task stands: queued (with its position in the batch's queue), running, or its ending. */
export const BatchTaskStatus = z.object({
  customId: z.string(),
  state: z.enum(['queued', 'running', 'done']),
  /** 0-based place in its batch's queue (queued tasks only). */
  position: z.number().int().optional(),
  attempts: z.number().int(),
  status: TaskStatus.optional(),
});
export type BatchTaskStatus = z.infer<typeof BatchTaskStatus>;

/**
 * `GET /v1/rollouts/:id`: where a hosted rollout attempt runs, its task's state in its batch
 * (`done` with the attempt that ended it), and what its model calls came to so far.
 */
export const Rollout = RolloutRecord.extend({ task: BatchTaskStatus, usage: RolloutOutcome.omit({ id: true, timesMs: true }) });
export type Rollout = z.infer<typeof Rollout>;
