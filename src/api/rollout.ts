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

/** What a rollout's model calls came to (in its result line). */
export const RolloutOutcome = z.object({
  /** The id its model calls are recorded under (one per attempt): its trajectory's. */
  id: z.string(),
  modelCalls: z.number().int(),
  tokens: z.number().int(),
  /** The first limit it hit, if any. */
  hit: z.enum(['max_model_calls', 'max_tokens', 'wall_time']).optional(),
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
  createdAt: z.string(),
});
export type RolloutRecord = z.infer<typeof RolloutRecord>;

