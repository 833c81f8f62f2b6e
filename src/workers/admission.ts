import { readFileSync } from 'node:fs';

/** What a node knows about itself at the moment it pulls a create request. */
export interface AdmissionState {
  capacity: { memoryMiB: number; cpuMillis: number; maxSandboxes: number };
  /** Requested resources of sandboxes live or starting here. */
  reserved: { memoryMiB: number; cpuMillis: number; diskMiB: number };
  sandboxes: number;
  /** Physical memory the host has free right now, MiB. */
  hostFreeMemoryMiB: number;
  /** Memory the host keeps for itself whatever the sandboxes requested, MiB. */
  hostReserveMiB: number;
  /** The scratch filesystem that holds every sandbox disk (see diskCapacityMiB). */
  disk: { capacityMiB: number; freeMiB: number; sizeMiB: number };
  /**
   * The chunk cache of lazy layers (a host without the layer store): what its mounted layers
   * may grow to, each counted at its whole blob, plus what starting sandboxes reserved.
   */
  layerCache?: { committedBytes: number; limitBytes: number };
  /** Pressure stall information now (readPressure) and the limits past which nothing new starts (0: not watched). */
  pressure?: { memoryFullPct: number; cpuSomePct: number; memoryFullMaxPct: number; cpuSomeMaxPct: number };
}

/**
 * `/proc/pressure/{memory,cpu}` avg10 (percent of the last 10 s): memory `full` (every
 * non-idle task stalled on memory: the host is thrashing) and cpu `some` (a task waited
 * for a CPU). Zero where the kernel has no PSI.
 */
export function readPressure(): { memoryFullPct: number; cpuSomePct: number } {
  const avg10 = (file: string, line: 'some' | 'full'): number => {
    try {
      return Number(new RegExp(`^${line} avg10=([\\d.]+)`, 'm').exec(readFileSync(file, 'utf8'))?.[1] ?? 0);
    } catch {
      return 0;
    }
  };
  return { memoryFullPct: avg10('/proc/pressure/memory', 'full'), cpuSomePct: avg10('/proc/pressure/cpu', 'some') };
}

export type AdmissionDecision = { admit: true } | { admit: false; reason: string };

/** Below this share of the scratch filesystem free, no new disk is admitted (overcommit's safety margin). */
const SCRATCH_MIN_FREE_FRACTION = 0.05;

/**
 * diskMiB the node promises in total: the scratch size times the overcommit (most agents
 * write a small part of their diskMiB), or exactly the scratch size when every disk
 * reserves its blocks at create (preallocated disks cannot be overcommitted).
 */
export function diskCapacityMiB(space: { sizeMiB: number; preallocated: boolean }, overcommit: number): number {
  return Math.floor(space.sizeMiB * (space.preallocated ? 1 : overcommit));
}

/**
 * Node-side admission (the second step of placement): decided from the node's own,
 * current state so a stale cluster snapshot can never overcommit it.
 */
/**
 * A request without diskMiB (the burst simulator's traces) asks for no disk;
 * `layerCacheBytes`: what its lazy layers not mounted here yet add to the chunk cache.
 */
export function decideAdmission(state: AdmissionState, request: { memoryMiB: number; cpuMillis: number; diskMiB?: number; layerCacheBytes?: number }): AdmissionDecision {
  const diskMiB = request.diskMiB ?? 0;
  if (state.sandboxes + 1 > state.capacity.maxSandboxes) return { admit: false, reason: `sandbox limit ${state.capacity.maxSandboxes} reached` };
  if (state.reserved.memoryMiB + request.memoryMiB > state.capacity.memoryMiB)
    return { admit: false, reason: `memory: ${state.reserved.memoryMiB} MiB reserved + ${request.memoryMiB} MiB requested > ${state.capacity.memoryMiB} MiB capacity` };
  if (state.reserved.cpuMillis + request.cpuMillis > state.capacity.cpuMillis)
    return { admit: false, reason: `cpu: ${state.reserved.cpuMillis}m reserved + ${request.cpuMillis}m requested > ${state.capacity.cpuMillis}m capacity` };
  if (state.reserved.diskMiB + diskMiB > state.disk.capacityMiB)
    return { admit: false, reason: `disk: ${state.reserved.diskMiB} MiB reserved + ${diskMiB} MiB requested > ${state.disk.capacityMiB} MiB capacity` };
  if (state.disk.freeMiB < state.disk.sizeMiB * SCRATCH_MIN_FREE_FRACTION)
    return { admit: false, reason: `disk pressure: ${state.disk.freeMiB} MiB of ${state.disk.sizeMiB} MiB scratch space free` };
  const cache = state.layerCache;
  const cacheBytes = request.layerCacheBytes ?? 0;
  if (cache && cacheBytes > 0 && cache.committedBytes + cacheBytes > cache.limitBytes) {
    const mib = (b: number) => Math.ceil(b / 1024 / 1024);
    return { admit: false, reason: `layer cache: ${mib(cache.committedBytes)} MiB held for mounted lazy layers + ${mib(cacheBytes)} MiB for this sandbox's > ${mib(cache.limitBytes)} MiB limit` };
  }
  if (state.hostFreeMemoryMiB < state.hostReserveMiB) return { admit: false, reason: `host memory pressure: ${state.hostFreeMemoryMiB} MiB free` };
  const p = state.pressure;
  if (p && p.memoryFullMaxPct > 0 && p.memoryFullPct > p.memoryFullMaxPct) return { admit: false, reason: `memory pressure: every task stalled on memory ${p.memoryFullPct}% of the last 10 s (limit ${p.memoryFullMaxPct}%)` };
  if (p && p.cpuSomeMaxPct > 0 && p.cpuSomePct > p.cpuSomeMaxPct) return { admit: false, reason: `cpu pressure: tasks waited for a CPU ${p.cpuSomePct}% of the last 10 s (limit ${p.cpuSomeMaxPct}%)` };
  return { admit: true };
}
