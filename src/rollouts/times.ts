import { ROLLOUT_TIME_PARTS, type CommandRecord, type ModelCallRecord, type RolloutTimePart, type RolloutTimesMs } from '../api/index.ts';

/** A span of time, epoch ms. */
export interface Span {
  fromMs: number;
  toMs: number;
}

export interface RolloutTimesInput {
  /** The rollout's wall time: its task sandbox's create request to its agent's exit. */
  window: Span;
  /** Its sandboxes' creates, requested to running. */
  envWaits: readonly Span[];
  calls: readonly Pick<ModelCallRecord, 'receivedAt' | 'endedAt' | 'heldMs'>[];
  /** Its task sandbox's commands. */
  commands: readonly Pick<CommandRecord, 'queuedAt' | 'endedAt'>[];
}

/**
 * Where a rollout's wall time went (RolloutTimesMs). A sequential agent's model calls,
 * commands and creates do not overlap; an agent that calls the model while a command runs
 * (or makes two calls at once) does, and each moment is counted once, in the first part of
 * ROLLOUT_TIME_PARTS that covers it, so the parts always sum to the total. A call is held
 * first and then upstream: the record keeps how long it was held, not when, and a call
 * waits in line before it goes up (a re-issue after a cut may hold again later; that time
 * is still counted as held, only placed earlier in the call). A command counts from its
 * queueing (the agent waits for it from there) to its end; one that had not ended when the
 * agent exited (left in the background) is not counted.
 */
export function rolloutTimes(input: RolloutTimesInput): RolloutTimesMs {
  const { window } = input;
  const spans: { part: RolloutTimePart; span: Span }[] = [];
  for (const call of input.calls) {
    const fromMs = Date.parse(call.receivedAt);
    const toMs = Date.parse(call.endedAt);
    const heldUntilMs = Math.min(toMs, fromMs + Math.round(call.heldMs));
    spans.push({ part: 'modelHeld', span: { fromMs, toMs: heldUntilMs } }, { part: 'modelUpstream', span: { fromMs: heldUntilMs, toMs } });
  }
  for (const command of input.commands) if (command.endedAt) spans.push({ part: 'tool', span: { fromMs: Date.parse(command.queuedAt), toMs: Date.parse(command.endedAt) } });
  for (const span of input.envWaits) spans.push({ part: 'envWait', span });

  // A sweep over the spans' edges: between two edges, the time goes to the first part open there.
  const rank = new Map(ROLLOUT_TIME_PARTS.map((part, i) => [part, i]));
  const edges: { atMs: number; rank: number; open: 1 | -1 }[] = [];
  for (const { part, span } of spans) {
    const fromMs = Math.max(window.fromMs, span.fromMs);
    const toMs = Math.min(window.toMs, span.toMs);
    if (!(toMs > fromMs)) continue;
    edges.push({ atMs: fromMs, rank: rank.get(part)!, open: 1 }, { atMs: toMs, rank: rank.get(part)!, open: -1 });
  }
  edges.sort((a, b) => a.atMs - b.atMs);
  const open = ROLLOUT_TIME_PARTS.map(() => 0);
  const times: RolloutTimesMs = { modelUpstream: 0, modelHeld: 0, tool: 0, envWait: 0, agent: 0, total: Math.max(0, window.toMs - window.fromMs) };
  let atMs = window.fromMs;
  const spend = (untilMs: number) => {
    const first = open.findIndex((n) => n > 0);
    times[first < 0 ? 'agent' : ROLLOUT_TIME_PARTS[first]!] += untilMs - atMs;
    atMs = untilMs;
  };
  for (const edge of edges) {
    spend(edge.atMs);
    open[edge.rank]! += edge.open;
  }
  if (window.toMs > atMs) spend(window.toMs);
  return times;
}
