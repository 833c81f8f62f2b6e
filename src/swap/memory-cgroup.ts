import { readdirSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';

/**
 * How a sandbox's memory cgroup pages out: `v1` (this host: no memory.reclaim) writes
 * memory.force_empty, which reclaims the whole cgroup (page cache dropped, anonymous memory
 * and shmem to swap) while its processes stay; `v2` asks memory.reclaim for everything it
 * holds, after opening memory.swap.max to the sandbox's own size (runc closes it at 0 when a
 * sandbox's swap limit equals its memory limit).
 */
export type MemoryCgroupKind = 'v1' | 'v2';

/** Chosen by the files a memory cgroup has: memory.reclaim (v2), else memory.force_empty (v1). */
export function memoryCgroupKindFrom(files: ReadonlySet<string>): MemoryCgroupKind | undefined {
  if (files.has('memory.reclaim')) return 'v2';
  if (files.has('memory.force_empty')) return 'v1';
  return undefined;
}

/** The kind of the memory cgroup at `dir` (undefined: no such cgroup). */
export function memoryCgroupKindOf(dir: string): MemoryCgroupKind | undefined {
  try {
    return memoryCgroupKindFrom(new Set(readdirSync(dir)));
  } catch {
    return undefined;
  }
}

/** What a sandbox holds in memory and what it has in swap, bytes. */
export interface MemoryHeld {
  residentBytes: number;
  swappedBytes: number;
}

const statField = (stat: string, name: string): number => Number(new RegExp(`^${name} (\\d+)$`, 'm').exec(stat)?.[1] ?? 0);
const readNumber = async (file: string): Promise<number> => Number((await readFile(file, 'utf8')).trim());

export async function readMemoryHeld(dir: string, kind: MemoryCgroupKind): Promise<MemoryHeld> {
  if (kind === 'v2') {
    const [current, swap] = await Promise.all([readNumber(path.join(dir, 'memory.current')), readNumber(path.join(dir, 'memory.swap.current')).catch(() => 0)]);
    return { residentBytes: current, swappedBytes: swap };
  }
  const [usage, stat] = await Promise.all([readNumber(path.join(dir, 'memory.usage_in_bytes')), readFile(path.join(dir, 'memory.stat'), 'utf8')]);
  return { residentBytes: usage, swappedBytes: statField(stat, 'total_swap') || statField(stat, 'swap') };
}

/** What every sandbox under these parents of the memory hierarchy at `memoryRoot` holds (each parent's hierarchical totals; a missing parent holds nothing). */
export async function memoryHeldUnderParents(memoryRoot: string, parents: readonly string[]): Promise<MemoryHeld> {
  const held = await Promise.all(
    parents.map(async (parent) => {
      const dir = path.join(memoryRoot, parent);
      const kind = memoryCgroupKindOf(dir);
      // A parent removed between the two reads (its last sandbox gone) holds nothing.
      return kind ? readMemoryHeld(dir, kind).catch(() => ({ residentBytes: 0, swappedBytes: 0 })) : { residentBytes: 0, swappedBytes: 0 };
    }),
  );
  return { residentBytes: held.reduce((sum, h) => sum + h.residentBytes, 0), swappedBytes: held.reduce((sum, h) => sum + h.swappedBytes, 0) };
}

/**
 * Everything the cgroup holds that the kernel can reclaim goes: page cache dropped, the
 * rest to swap, capped at the sandbox's memory limit (v1: the memsw limit, equal to the
 * memory limit, caps memory and swap together; v2: memory.swap.max opened to memory.max).
 * Its processes must be frozen: nothing touches the memory meanwhile.
 */
export async function reclaimAll(dir: string, kind: MemoryCgroupKind): Promise<void> {
  if (kind === 'v2') {
    await writeFile(path.join(dir, 'memory.swap.max'), (await readFile(path.join(dir, 'memory.max'), 'utf8')).trim());
    const current = await readNumber(path.join(dir, 'memory.current'));
    // EAGAIN: it reclaimed what it could (kernel memory stays); that is the answer.
    await writeFile(path.join(dir, 'memory.reclaim'), String(current)).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'EAGAIN') throw err;
    });
    return;
  }
  // Anonymous memory is reclaimed as readily as page cache only at the highest swappiness.
  const swappinessFile = path.join(dir, 'memory.swappiness');
  const swappiness = (await readFile(swappinessFile, 'utf8')).trim();
  await writeFile(swappinessFile, '200').catch(() => writeFile(swappinessFile, '100'));
  try {
    await writeFile(path.join(dir, 'memory.force_empty'), '0');
  } finally {
    await writeFile(swappinessFile, swappiness);
  }
}

/** After a resume (v2): swap closed again, as runc set it, so a running sandbox never swaps. */
export async function closeSwap(dir: string, kind: MemoryCgroupKind): Promise<void> {
  if (kind === 'v2') await writeFile(path.join(dir, 'memory.swap.max'), '0').catch(() => undefined);
}
