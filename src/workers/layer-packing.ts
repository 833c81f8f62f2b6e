import { mkdir, rm } from 'node:fs/promises';
import path from 'node:path';
import type { HostContext } from './host-context.ts';
import type { RuntimeSnapshot } from './runtime/index.ts';

/** A packed layer is safe from garbage collection this long if its record is never written. */
const LAYER_PIN_MS = 30 * 60_000;

/** A sandbox's writable layer packed into a layer (a snapshot, or a container's hibernation), stored and pinned. */
export async function packWritableLayer(ctx: HostContext, sandboxId: string, requestId: string, exclude: readonly string[]): Promise<{ digest: string; sizeBytes: number; frozenMs: number }> {
  ctx.requireLocal(sandboxId);
  let frozenMs = 0;
  const stored = await storePacked(ctx, requestId, async (outPath) => {
    const packed = await ctx.deps.runtime.snapshot(sandboxId, { outPath, excludePaths: exclude });
    frozenMs = packed.frozenMs;
    return packed.split;
  });
  return { ...stored, frozenMs };
}

/** A layer image `pack` writes at its path (or the split layer it answers), stored in the layer store and pinned there. */
export async function storePacked(ctx: HostContext, requestId: string, pack: (outPath: string) => Promise<RuntimeSnapshot['split'] | void>): Promise<{ digest: string; sizeBytes: number }> {
  await mkdir(ctx.deps.tmpDir, { recursive: true });
  const outPath = path.join(ctx.deps.tmpDir, `pack-${requestId}.erofs`);
  try {
    const split = await pack(outPath);
    const stored = split ? await ctx.deps.storeSplitLayer(split) : await ctx.deps.storeLayerImage(outPath);
    // Unreferenced until the hibernated sandbox, the snapshot's record or a fork's children name it.
    await ctx.layers.pin(stored.digest, ctx.now() + LAYER_PIN_MS);
    return stored;
  } finally {
    await Promise.all([outPath, `${outPath}.meta`, `${outPath}.blob`].map((p) => rm(p, { force: true })));
  }
}
