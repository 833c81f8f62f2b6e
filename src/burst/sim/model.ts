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
  /** Diverted, but no cloud slot was free at arrival so it ran or waited locally. */
  divertedFellBackLocal: number;
  /** Stayed local while diverting: layers not synced or stayLocal. */
  ineligible: number;
  byReason: Record<string, number>;
  /** Could not start locally at arrival: no local node had room for it right then. */
  overflow: number;
  overflowAbsorbedByCloud: number;
  overflowAbsorbedShare: number;
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
