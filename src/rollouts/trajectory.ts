import type { CommandRecord, ModelCallRecord, TrajectoryEntry } from '../api/index.ts';

/**
 * The model calls and the task sandboxes' commands of one rollout, interleaved in the order
 * they began. Ties keep model calls first: an agent asks the model, then runs what it said.
 * The sort is stable, so each source keeps its own order among equal times.
 */
export function interleave(calls: readonly ModelCallRecord[], commands: readonly { sandboxId: string; command: CommandRecord }[]): TrajectoryEntry[] {
  const entries: TrajectoryEntry[] = [
    ...[...calls].sort((a, b) => a.turn - b.turn).map((call): TrajectoryEntry => ({ kind: 'model_call', at: call.receivedAt, call })),
    ...commands.map(({ sandboxId, command }): TrajectoryEntry => ({ kind: 'command', at: command.startedAt ?? command.queuedAt, sandboxId, command })),
  ];
  return entries.sort((a, b) => Date.parse(a.at) - Date.parse(b.at));
}
