import { z } from 'zod';
import { CommandRecord, ExecRequest } from './exec.ts';
import { ModelCallRecord } from './model.ts';
import { CreateSandboxRequest } from './sandbox.ts';

/**
 * One entry of a hosted rollout's trajectory: a model call (from the model gateway's log) or a
 * command of its task sandbox (from that sandbox's command log). `at` is when it began: a
 * call's arrival at the gateway, a command's start (its queueing when it never started).
 */
export const TrajectoryEntry = z.discriminatedUnion('kind', [
  z.object({ kind: z.literal('model_call'), at: z.string(), call: ModelCallRecord }),
  z.object({ kind: z.literal('command'), at: z.string(), sandboxId: z.string(), command: CommandRecord }),
]);
export type TrajectoryEntry = z.infer<typeof TrajectoryEntry>;

export const Trajectory = z.object({ rolloutId: z.string(), entries: z.array(TrajectoryEntry) });
export type Trajectory = z.infer<typeof Trajectory>;

/**
 * A hosted rollout's agent: a command run in its own **agent sandbox** (the task's image
 * unless it names one), whose network reaches the gateway and nothing else, with the
 * rollout's key (granted its task sandbox and its model calls only) in its env.
 */
export const RolloutAgent = z
  .strictObject({
    image: CreateSandboxRequest.shape.image.optional(),
    argv: ExecRequest.shape.argv,
    cmd: ExecRequest.shape.cmd,
    env: ExecRequest.shape.env,
    resources: CreateSandboxRequest.shape.resources,
    timeoutMs: z.number().int().min(1).max(3600 * 1000),
  })
  .refine((a) => (a.argv === undefined) !== (a.cmd === undefined), 'give exactly one of argv and cmd');
export type RolloutAgent = z.infer<typeof RolloutAgent>;

/** The training job whose upstreams the rollout's model calls go to (`PUT /v1/jobs/:job/model`); its sandboxes carry it (job pause). */
export const RolloutModel = z.strictObject({ job: z.string().regex(/^[A-Za-z0-9_.:-]{1,128}$/, 'job is [A-Za-z0-9_.:-]{1,128}') });
export type RolloutModel = z.infer<typeof RolloutModel>;

/** What one rollout may spend on its model (its wall time is the agent's `timeoutMs`). */
export const RolloutLimits = z.strictObject({
  maxModelCalls: z.number().int().min(1).max(100_000).optional(),
  maxTokens: z.number().int().min(1).optional(),
});
export type RolloutLimits = z.infer<typeof RolloutLimits>;

/**
 * Where a rollout's wall time went (issue 39 point 8), ms, computed once when its agent
 * exits, or at the cancel that ended it (of it or its batch). `total` runs from its task
 * sandbox's create request to its agent's exit (or that cancel); each
 * moment of it counts once, in the first part that covers it: `modelUpstream` (a model
 * call in flight, not held: upstream and the gateway's own relay), `modelHeld` (a call held
 * while the job was paused or its upstreams away), `tool` (a command of its task sandbox,
 * queued to ended: setup steps and the agent's tools), `envWait` (its task and agent
 * sandboxes' creates, requested to running), then `agent`: the rest (the agent's own
 * work between them). So the parts sum to `total`.
 */
export const RolloutTimesMs = z.object({
  modelUpstream: z.number().int(),
  modelHeld: z.number().int(),
  tool: z.number().int(),
  envWait: z.number().int(),
  agent: z.number().int(),
  total: z.number().int(),
});
export type RolloutTimesMs = z.infer<typeof RolloutTimesMs>;
/** The parts of RolloutTimesMs, in the order a moment is given to the first that covers it (`agent` last: the rest). */
export const ROLLOUT_TIME_PARTS = ['modelUpstream', 'modelHeld', 'tool', 'envWait', 'agent'] as const satisfies readonly (keyof RolloutTimesMs)[];
export type RolloutTimePart = (typeof ROLLOUT_TIME_PARTS)[number];

/**
 * How a rollout ended, for its job's completion rate: its task's status, except that one
 * which did not succeed after hitting a model limit (calls, tokens, wall time) is `limit`.
 */
export const RolloutEnd = z.enum(['succeeded', 'failed', 'timeout', 'limit', 'cancelled', 'infra_error']);
export type RolloutEnd = z.infer<typeof RolloutEnd>;

/** `GET /v1/jobs/:job/rollout-times`: a training job's ended rollouts and where their time went. */
export const JobRolloutTimes = z.object({
  job: z.string(),
  /** Rollouts ended, by how they ended. */
  ended: z.record(RolloutEnd, z.number().int()),
  /** Succeeded over all ended; null before any ended. */
  completionRate: z.number().nullable(),
  /** Rollouts whose times are summed in `timesMs`: those whose agent ran to its exit or was cancelled (not those lost). */
  timed: z.number().int(),
  /** Sums over the timed rollouts, ms (divide by `timed` for a rollout's mean). */
  timesMs: RolloutTimesMs,
});
export type JobRolloutTimes = z.infer<typeof JobRolloutTimes>;

/** What a rollout's model calls came to (in its result line). */
export const RolloutOutcome = z.object({
  /** The id its model calls are recorded under (one per attempt): its trajectory's. */
  id: z.string(),
  modelCalls: z.number().int(),
  tokens: z.number().int(),
  /** The first limit it hit, if any. */
  hit: z.enum(['max_model_calls', 'max_tokens', 'wall_time']).optional(),
  /** Where its time went, up to its agent's exit (or the cancel that ended it). */
  timesMs: RolloutTimesMs.optional(),
});
export type RolloutOutcome = z.infer<typeof RolloutOutcome>;

/** Where a hosted rollout attempt ran (GET /v1/rollouts/:id): its trajectory is read from these. */
export const RolloutRecord = z.object({
  id: z.string(),
  tenant: z.string(),
  job: z.string(),
  batchId: z.string(),
  customId: z.string(),
  attempt: z.number().int(),
  taskSandboxId: z.string(),
  agentSandboxId: z.string(),
  /** When its agent was about to start. */
  createdAt: z.string(),
  /** Its task and agent sandboxes' creates, requested to running (epoch ms): its wall time starts at the first. */
  envWaits: z.array(z.object({ fromMs: z.number(), toMs: z.number() })).optional(),
  /** Where its time went, written once when its agent exits. */
  timesMs: RolloutTimesMs.optional(),
});
export type RolloutRecord = z.infer<typeof RolloutRecord>;

