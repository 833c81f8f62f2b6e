import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { RollboxError } from '../../api/index.ts';
import { closeSwap, memoryCgroupKindOf, memoryHeldUnderParents, prefetchSwapped, readMemoryHeld, reclaimAll, type MemoryCgroupKind, type MemoryHeld, type SwapSpace } from '../../swap/index.ts';
import { procsOfTree } from './cgroups.ts';
import type { RuntimeContext } from './context.ts';
import { freezerStateFile, setFrozen } from './policy.ts';

async function memoryCgroupOf(ctx: RuntimeContext, id: string): Promise<{ dir: string; kind: MemoryCgroupKind }> {
  const dir = path.join((await ctx.cgroups()).memory, ctx.cgroupRel(id));
  const kind = memoryCgroupKindOf(dir);
  if (!kind) throw new RollboxError('invalid_state', `sandbox ${id} has no memory cgroup on this host`);
  return { dir, kind };
}

/**
 * Pause mode `swap`: room for what the sandbox holds is claimed in the host's swap file
 * first (refused `swap_unavailable` with the sandbox untouched), then it is frozen (if it
 * was not) and its whole memory cgroup reclaimed: page cache dropped, the rest to swap. Its
 * processes, open files and connections stay; answers what it holds afterwards.
 */
export async function swapOut(ctx: RuntimeContext, swap: SwapSpace | undefined, id: string): Promise<MemoryHeld> {
  if (!swap) throw new RollboxError('swap_unavailable', 'this worker host has no swap space for sandboxes');
  return ctx.locked(id, async () => {
    const cgroup = await memoryCgroupOf(ctx, id);
    const before = await readMemoryHeld(cgroup.dir, cgroup.kind);
    const release = await swap.reserve(before.residentBytes);
    const wasFrozen = (await readFile(await freezerStateFile(ctx, id), 'utf8')).trim() === 'FROZEN';
    try {
      await setFrozen(ctx, id, true);
      try {
        await swap.oneAtATime(() => reclaimAll(cgroup.dir, cgroup.kind));
      } catch (err) {
        // As it was: whatever went to swap comes back as it is touched.
        if (!wasFrozen) await setFrozen(ctx, id, false);
        throw err;
      }
      return await readMemoryHeld(cgroup.dir, cgroup.kind);
    } finally {
      release();
    }
  });
}

/** The memory of every sandbox under these cgroup parents (each tree's hierarchical totals). */
export async function memoryHeldUnder(ctx: RuntimeContext, parents: readonly string[]): Promise<MemoryHeld> {
  return memoryHeldUnderParents((await ctx.cgroups()).memory, parents);
}

/**
 * Thaw, after reading back what a swap pause paged out (a frozen sandbox with nothing in
 * swap only thaws): every process's swapped memory is prefetched (rollbox-memctl), so the
 * sandbox's first instructions do not each wait for the disk.
 */
export async function resumeSwapped(ctx: RuntimeContext, swap: SwapSpace | undefined, memctlBinary: string | undefined, id: string): Promise<void> {
  const cgroup = await memoryCgroupOf(ctx, id).catch(() => undefined);
  if (cgroup && (await readMemoryHeld(cgroup.dir, cgroup.kind)).swappedBytes > 0) {
    // Every process of the sandbox: commands run in cgroups of their own under its cgroup.
    const prefetch = () => prefetchSwapped(procsOfTree(cgroup.dir), memctlBinary);
    await (swap ? swap.oneAtATime(prefetch) : prefetch());
    await closeSwap(cgroup.dir, cgroup.kind);
  }
  await setFrozen(ctx, id, false);
}
