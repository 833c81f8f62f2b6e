export { SwapSpace, parseProcSwaps, type SwapArea, type SwapSpaceOptions } from './swap-space.ts';
export { closeSwap, memoryCgroupKindFrom, memoryCgroupKindOf, memoryHeldUnderParents, readMemoryHeld, reclaimAll, type MemoryCgroupKind, type MemoryHeld } from './memory-cgroup.ts';
export { DEFAULT_MEMCTL_BINARY, prefetchSwapped } from './prefetch.ts';
