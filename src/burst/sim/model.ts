import { z } from 'zod';

/**
 * The world the simulator replays a trace against (the policy itself is a BurstPolicy).
 * Parsed once with defaults, like the policy; CLI flags override single fields.
 */
export const SimModel = z.strictObject({
  localNodes: z.number().int().min(1).max(10_000).default(30),
  nodeCpuMillis: z.number().int().min(1).default(16_000),
  nodeMemoryMiB: z.number().int().min(1).default(65_536),
  nodeMaxSandboxes: z.number().int().min(1).default(64),
  /** d in power-of-d-choices placement (gateway side). */
  placementChoices: z.number().int().min(1).default(2),
  /** Node refusals before a create stops being re-placed and waits in the queue. */
  maxRefusals: z.number().int().min(0).default(3),
  /** Placement and the controller see node state as of the last heartbeat. */
  heartbeatIntervalMs: z.number().int().min(1).default(1000),
  /** A create waiting longer than this gives up (counted as refused). */
  maxQueueWaitMs: z.number().int().min(0).max(86_400_000).default(600_000),
  /** With utilizationBasis 'measured': measured use as a share of requested (sandboxes rarely use all they ask). */
  measuredShareOfRequest: z.number().min(0).max(1).default(1),
  /** From a provision call to a booted VM. */
  cloudProvisioningDelayMs: z.number().int().min(0).default(90_000),
  /** Syncing the layer set before the host reports ready. */
  cloudLayerSyncDelayMs: z.number().int().min(0).default(30_000),
  /**
   * A diverted create that finds no free cloud slot waits this long for one (while a host
   * is provisioning or the cap allows another) before falling back to local placement.
   * 0: it falls back at once and waits in the shared queue, where a cloud slot that frees
   * may still take it (what the live controller does). A positive value models the
   * alternative, waiting for a VM first, to show what it costs.
   */
  cloudWaitMs: z.number().int().min(0).max(86_400_000).default(0),
  /** Layers pre-synced to the cloud pool; empty = take the trace header's list. */
  syncedLayers: z.array(z.string()).default([]),
  seed: z.number().int().default(1),
});
export type SimModel = z.infer<typeof SimModel>;

export interface SimResult {
  creates: number;
  startedLocal: number;
  startedCloud: number;
  /** Gave up after maxQueueWaitMs without starting. */
  refused: number;
  /** Decided 'cloud' by the policy. */
  diverted: number;
  /** Diverted, but found no cloud slot (at arrival, or within cloudWaitMs) and went to local placement. */
  divertedFellBackLocal: number;
  /** Stayed local while diverting: layers not synced or stayLocal. */
  ineligible: number;
  byReason: Record<string, number>;
  /** Did not start on a local host at arrival: went to the cloud, or waited. */
  overflow: number;
  /** Overflow that ran in the cloud (every cloud start is overflow). */
  overflowAbsorbedByCloud: number;
  overflowAbsorbedShare: number;
  /** Arrived when no local host had room for it (true state, not the snapshot). */
  noLocalRoomAtArrival: number;
  /** Time from arrival to start; refused creates count at their give-up wait. */
  queueWaitP50Ms: number;
  queueWaitP99Ms: number;
  queueWaitMeanMs: number;
  /** Creates that did not start at arrival. */
  waited: number;
  cloudVmHours: number;
  peakCloudHosts: number;
  cloudProvisions: number;
  /** Share of the simulated time the controller was diverting. */
  divertingTimeShare: number;
  meanUtilization: number;
  peakUtilization: number;
  simulatedMs: number;
  events: number;
}
