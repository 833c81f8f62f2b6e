import { z } from 'zod';
import { CommandRecord } from './exec.ts';
import { ModelCallRecord } from './model.ts';

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
