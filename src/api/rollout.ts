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
 * A hosted rollout's agent (issue 39): a command run in its own sandbox, whose network reaches
 * only the gateway, with a rollout key granted only the task sandbox.
 * Not yet accepted by batches: runTask does not run it (see the branch report).
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

/** The model job whose upstream the rollout's model calls go to (`PUT /v1/jobs/:job/model`). */
export const RolloutModel = z.strictObject({ job: z.string().min(1).max(128) });
export type RolloutModel = z.infer<typeof RolloutModel>;
