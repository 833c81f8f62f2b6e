/**
 * The one cloud-burst policy (issue 5), pure: no I/O, no clock, no Math.random. Time
 * and random draws come in as arguments, so the live controller and the simulator make
 * the same decisions from the same inputs.
 */
import type { BurstDecisionReason, BurstPolicy, UtilizationBasis } from '../../api/index.ts';

export { mulberry32, rngStream } from './random.ts';

/** What the policy needs to know about one local node. */
export interface NodeUsage {
  capacity: { cpuMillis: number; memoryMiB: number };
  /** Resources requested by its live sandboxes. */
  requested: { cpuMillis: number; memoryMiB: number };
  /** Measured use as fractions of this node's capacity, 0..1. */
  measured: { cpuFraction: number; memoryFraction: number };
}

/**
 * Pool utilization, 0..1: the more constrained of CPU and memory, each pooled over all
 * nodes (sum used / sum capacity), so a big node weighs more than a small one. An empty
 * pool counts as full: there is nowhere local to put anything. `extraLoad` (in the
 * basis's terms) is added to the nodes' use: the cloud's sandboxes, for the stop rule of
 * stepDiversion.
 */
export function utilizationOf(nodes: readonly NodeUsage[], basis: UtilizationBasis, extraLoad: { cpuMillis: number; memoryMiB: number } = NO_LOAD): number {
  let cpuCapacity = 0;
  let memoryCapacity = 0;
  let cpuUsed = extraLoad.cpuMillis;
  let memoryUsed = extraLoad.memoryMiB;
  for (const node of nodes) {
    cpuCapacity += node.capacity.cpuMillis;
    memoryCapacity += node.capacity.memoryMiB;
    if (basis === 'requested') {
      cpuUsed += node.requested.cpuMillis;
      memoryUsed += node.requested.memoryMiB;
    } else {
      cpuUsed += node.measured.cpuFraction * node.capacity.cpuMillis;
      memoryUsed += node.measured.memoryFraction * node.capacity.memoryMiB;
    }
  }
  if (cpuCapacity <= 0 || memoryCapacity <= 0) return 1;
  return Math.min(1, Math.max(cpuUsed / cpuCapacity, memoryUsed / memoryCapacity, 0));
}

const NO_LOAD = { cpuMillis: 0, memoryMiB: 0 };

export interface DiversionState {
  diverting: boolean;
  divertingSinceMs: number | null;
  /** While diverting: since when utilization has been below stopBelowUtilization. */
  belowStopSinceMs: number | null;
}

export const INITIAL_DIVERSION_STATE: DiversionState = { diverting: false, divertingSinceMs: null, belowStopSinceMs: null };

/**
 * One observation of utilization at `nowMs`. Starts diverting when utilization is above
 * divertAbove; stops only once it has stayed below stopBelow for dwellMs, so a pool
 * hovering at the threshold does not flap. "Stayed below" is judged from the
 * observations: the first one below starts the dwell clock, any one at or above resets it.
 * With policy.stopCountsCloudLoad the stop rule looks at `utilizationWithCloudLoad`
 * (utilizationOf with the cloud's sandboxes as extraLoad) when the caller passes it.
 */
export function stepDiversion(state: DiversionState, utilization: number, nowMs: number, policy: BurstPolicy, utilizationWithCloudLoad?: number): DiversionState {
  if (!state.diverting) {
    return utilization > policy.divertAboveUtilization ? { diverting: true, divertingSinceMs: nowMs, belowStopSinceMs: null } : state;
  }
  const stopUtilization = policy.stopCountsCloudLoad && utilizationWithCloudLoad !== undefined ? Math.max(utilization, utilizationWithCloudLoad) : utilization;
  if (stopUtilization >= policy.stopBelowUtilization) return state.belowStopSinceMs === null ? state : { ...state, belowStopSinceMs: null };
  const belowStopSinceMs = state.belowStopSinceMs ?? nowMs;
  if (nowMs - belowStopSinceMs >= policy.dwellMs) return INITIAL_DIVERSION_STATE;
  return belowStopSinceMs === state.belowStopSinceMs ? state : { ...state, belowStopSinceMs };
}

export interface CreateDecision {
  target: 'local' | 'cloud';
  reason: BurstDecisionReason;
}

/**
 * Local or cloud for one new create. Eligible for the cloud: not stayLocal and every
 * layer in the cloud pool's pre-synced set. `rngUnit` in [0, 1) picks the divertShare;
 * callers draw it for every create, diverting or not, so the draws line up across policies.
 */
export function decideCreate(
  state: DiversionState,
  request: { layers: readonly string[]; stayLocal?: boolean | undefined },
  syncedLayers: ReadonlySet<string>,
  rngUnit: number,
  policy: BurstPolicy,
): CreateDecision {
  if (!state.diverting) return { target: 'local', reason: 'not_diverting' };
  if (request.stayLocal) return { target: 'local', reason: 'stay_local' };
  if (!request.layers.every((layer) => syncedLayers.has(layer))) return { target: 'local', reason: 'layers_not_synced' };
  if (rngUnit >= policy.divertShare) return { target: 'local', reason: 'share' };
  return { target: 'cloud', reason: 'diverted' };
}

export interface CloudHostView {
  id: string;
  state: 'provisioning' | 'ready';
  sandboxes: number;
  /** Since when a ready host has had no sandboxes; null while busy or provisioning. */
  idleSinceMs: number | null;
}

export interface CloudScalingInput {
  /** Hosts not being terminated. */
  cloudHosts: readonly CloudHostView[];
  /** Diverted creates waiting for a cloud slot. */
  pendingDivertedDemand: number;
  /** Hosts whose provisioning started in the last 60 s. */
  provisionsInLastMinute: number;
  nowMs: number;
}

export interface CloudScalingPlan {
  provision: number;
  terminate: string[];
}

/**
 * Scale up when diverted demand exceeds the free slots of ready and provisioning hosts,
 * within maxCloudHosts and maxProvisionsPerMinute; terminate ready hosts idle longer
 * than idleTerminateMs (longest idle first), keeping enough free slots for the demand.
 */
export function planCloudScaling(input: CloudScalingInput, policy: BurstPolicy): CloudScalingPlan {
  const slotsPerHost = policy.cloudHostSandboxes;
  let freeSlots = 0;
  for (const host of input.cloudHosts) freeSlots += Math.max(0, slotsPerHost - host.sandboxes);
  const shortfall = input.pendingDivertedDemand - freeSlots;
  const wanted = shortfall > 0 ? Math.ceil(shortfall / slotsPerHost) : 0;
  const capRoom = policy.maxCloudHosts - input.cloudHosts.length;
  const rateRoom = policy.maxProvisionsPerMinute - input.provisionsInLastMinute;
  const provision = Math.max(0, Math.min(wanted, capRoom, rateRoom));

  const idle = input.cloudHosts
    .filter((h) => h.state === 'ready' && h.sandboxes === 0 && h.idleSinceMs !== null && input.nowMs - h.idleSinceMs >= policy.idleTerminateMs)
    .sort((a, b) => a.idleSinceMs! - b.idleSinceMs! || (a.id < b.id ? -1 : 1));
  const terminate: string[] = [];
  for (const host of idle) {
    if (freeSlots - slotsPerHost < input.pendingDivertedDemand) break;
    freeSlots -= slotsPerHost;
    terminate.push(host.id);
  }
  return { provision, terminate };
}
