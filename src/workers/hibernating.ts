import { RollboxError } from '../api/index.ts';
import { takeOutExecOps } from '../queues/index.ts';
import type { TransitionOutcome } from '../registry/index.ts';
import { keepCarriedCommands } from './carried-commands.ts';
import type { HostContext } from './host-context.ts';
import { packWritableLayer } from './layer-packing.ts';
import { markedPaused } from './pausing.ts';

/**
 * Pack the writable layer, then stop the container: its memory goes back to the host.
 * Waking it starts a new container over its layers with that layer copied back into the
 * upper dir, so hibernating again replaces the layer instead of stacking another. A
 * sandbox its runtime saves whole (a microVM) keeps its processes instead: its image goes
 * to the layer store, where the host that wakes it finds it.
 */
export async function hibernate(ctx: HostContext, sandboxId: string, requestId: string): Promise<void> {
  const sandbox = await ctx.deps.registry.get(sandboxId);
  if (!sandbox) throw new RollboxError('not_found', `sandbox ${sandboxId} not found`);
  ctx.requireLocal(sandboxId);
  const moved = await markedPaused(ctx, sandboxId, () => storeAndLeave(ctx, sandboxId, requestId));
  if (moved.kind !== 'ok') throw new RollboxError('conflict', `sandbox ${sandboxId} changed state while hibernating`);
  const expiresAtMs = Date.parse(sandbox.expiresAt ?? '');
  if (expiresAtMs) await ctx.deps.registry.watchHibernatedTtl(sandboxId, expiresAtMs);
}

/** Its processes whole (microVMs) or its writable layer, stored; the sandbox off this host and recorded `hibernated`. */
async function storeAndLeave(ctx: HostContext, sandboxId: string, requestId: string): Promise<TransitionOutcome> {
  if (ctx.deps.runtime.hibernatesWhole(sandboxId)) {
    const imageDir = ctx.deps.hibernatedImageDirOf(sandboxId);
    const { carriedCommands } = await ctx.deps.runtime.hibernateWhole(sandboxId, imageDir);
    // Their exec messages leave this host with the image: whoever wakes it collects them (create-handler.ts).
    const carried = await takeOutExecOps(ctx.deps.redis, ctx.nodeId, sandboxId, carriedCommands, (raws) => keepCarriedCommands(imageDir, raws));
    if (carried.length) ctx.log.info({ sandboxId, commands: carried.length }, 'hibernated whole with commands running: they wake with it');
    await ctx.removeLocal(sandboxId);
    return ctx.deps.registry.transition(sandboxId, 'hibernated', { from: ['running', 'paused'], node: ctx.nodeId, hibernatedWhole: true, swapped: null });
  }
  const stored = await packWritableLayer(ctx, sandboxId, requestId, []);
  await ctx.removeLocal(sandboxId);
  const moved = await ctx.deps.registry.transition(sandboxId, 'hibernated', { from: ['running', 'paused'], node: ctx.nodeId, hibernationLayer: stored.digest, swapped: null });
  await ctx.layers.unpin(stored.digest);
  return moved;
}
