/** What a node knows about itself at the moment it pulls a create request. */
export interface AdmissionState {
  capacity: { memoryMiB: number; cpuMillis: number; maxSandboxes: number };
  /** Requested resources of sandboxes live or starting here. */
  reserved: { memoryMiB: number; cpuMillis: number };
  sandboxes: number;
  /** Physical memory the host has free right now, MiB. */
  hostFreeMemoryMiB: number;
  /** Memory the host keeps for itself whatever the sandboxes requested, MiB. */
  hostReserveMiB: number;
}

export type AdmissionDecision = { admit: true } | { admit: false; reason: string };

/**
 * Node-side admission (the second step of placement): decided from the node's own,
 * current state so a stale cluster snapshot can never overcommit it.
 */
export function decideAdmission(state: AdmissionState, request: { memoryMiB: number; cpuMillis: number }): AdmissionDecision {
  if (state.sandboxes + 1 > state.capacity.maxSandboxes) return { admit: false, reason: `sandbox limit ${state.capacity.maxSandboxes} reached` };
  if (state.reserved.memoryMiB + request.memoryMiB > state.capacity.memoryMiB)
    return { admit: false, reason: `memory: ${state.reserved.memoryMiB} MiB reserved + ${request.memoryMiB} MiB requested > ${state.capacity.memoryMiB} MiB capacity` };
  if (state.reserved.cpuMillis + request.cpuMillis > state.capacity.cpuMillis)
    return { admit: false, reason: `cpu: ${state.reserved.cpuMillis}m reserved + ${request.cpuMillis}m requested > ${state.capacity.cpuMillis}m capacity` };
  if (state.hostFreeMemoryMiB < state.hostReserveMiB) return { admit: false, reason: `host memory pressure: ${state.hostFreeMemoryMiB} MiB free` };
  return { admit: true };
}
