import { RollboxError } from '../api/index.ts';
import type { HostContext } from './host-context.ts';

const MIB = 1024 * 1024;

/** Freeze or thaw (a sandbox a swap pause paged out is read back first, and counts whole again). */
export async function setPaused(ctx: HostContext, sandboxId: string, paused: boolean): Promise<void> {
  ctx.requireLocal(sandboxId);
  if (paused) await markedPaused(ctx, sandboxId, () => ctx.deps.runtime.pause(sandboxId));
  else await ctx.deps.runtime.resume(sandboxId);
  await ctx.deps.registry.transition(sandboxId, paused ? 'paused' : 'running', { from: [paused ? 'running' : 'paused'], node: ctx.nodeId, ...(paused ? {} : { swapped: null }) });
  const local = ctx.local.get(sandboxId);
  if (!paused && local) {
    delete local.residentMiB;
    delete local.paused;
  }
}

/**
 * Marks the sandbox paused before `freeze` runs (a pause, a hibernation), so the port relay
 * refuses it from then on (a connection opened into a frozen server would wait unanswered),
 * and unmarks it if `freeze` fails, unless it was paused already.
 */
export async function markedPaused<T>(ctx: HostContext, sandboxId: string, freeze: () => Promise<T>): Promise<T> {
  const local = ctx.local.get(sandboxId);
  const wasPaused = local?.paused === true;
  if (local) local.paused = true;
  try {
    return await freeze();
  } catch (err) {
    if (local && !wasPaused) delete local.paused;
    throw err;
  }
}

/**
 * Pause mode `swap` (a running sandbox, or one frozen already): frozen, its memory paged
 * out; from then on it counts in admission for what it still holds. Without room in the
 * host's swap file the runtime refuses before anything changed.
 */
export async function swapOut(ctx: HostContext, sandboxId: string): Promise<void> {
  ctx.requireLocal(sandboxId);
  const held = await markedPaused(ctx, sandboxId, () => ctx.deps.runtime.swapOut(sandboxId));
  const local = ctx.local.get(sandboxId);
  if (local) local.residentMiB = Math.ceil(held.residentBytes / MIB);
  const moved = await ctx.deps.registry.transition(sandboxId, 'paused', { from: ['running'], node: ctx.nodeId, swapped: held });
  if (moved.kind !== 'ok' && !(await ctx.deps.registry.setSwapped(sandboxId, ctx.nodeId, held))) {
    throw new RollboxError('conflict', `sandbox ${sandboxId} changed state while its memory was paged out`);
  }
}
