import { z } from 'zod';

/** Fraction of capacity, 0..1. */
const Fraction = z.number().min(0).max(1);

/**
 * Which numbers count as "used" when the burst controller computes local utilization:
 * `requested` = resources that live sandboxes asked for (what admission reserves);
 * `measured` = what the hosts report actually using (cpu load, memory in use).
 */
export const UtilizationBasis = z.enum(['requested', 'measured']);
export type UtilizationBasis = z.infer<typeof UtilizationBasis>;

/**
 * The cloud-burst policy (issue 5; DSec "For burst demand"): when local utilization
 * passes `divertAboveUtilization`, a share of the eligible new creates (every layer
 * pre-synced to the cloud pool, not asked to stay local) goes to cloud hosts. The same
 * object drives the live controller and the simulator. `PUT /v1/burst/policy` replaces
 * it whole: missing fields take these defaults.
 */
export const BurstPolicy = z
  .strictObject({
    /** Start diverting when pool utilization is strictly above this. 1.0 never diverts. */
    divertAboveUtilization: Fraction.default(0.8),
    /** Stop diverting only after utilization stayed below this for `dwellMs` (hysteresis). */
    stopBelowUtilization: Fraction.default(0.7),
    dwellMs: z.number().int().min(0).max(86_400_000).default(60_000),
    /**
     * Judge "below stopBelow" on the load the local pool would carry if the cloud's
     * sandboxes came home, not on local load alone. Without it, cloud capacity that
     * absorbs a burst makes the local pool look cool, diversion stops mid-burst and the
     * next creates overflow locally again (the simulator shows queue waits then rise with
     * more cloud hosts).
     */
    stopCountsCloudLoad: z.boolean().default(true),
    /** Share of eligible new creates sent to the cloud while diverting (DSec diverts "part"). */
    divertShare: Fraction.default(1),
    utilizationBasis: UtilizationBasis.default('requested'),
    maxCloudHosts: z.number().int().min(0).max(10_000).default(4),
    /** Provisioning rate cap: VMs started in any trailing 60 s window. */
    maxProvisionsPerMinute: z.number().int().min(0).max(10_000).default(2),
    /** A ready cloud host with no sandboxes for this long is terminated. */
    idleTerminateMs: z.number().int().min(0).max(7 * 86_400_000).default(300_000),
    /** Sandbox slots per cloud host (VM). */
    cloudHostSandboxes: z.number().int().min(1).max(10_000).default(8),
  })
  .refine((p) => p.stopBelowUtilization <= p.divertAboveUtilization, {
    message: 'stopBelowUtilization must not exceed divertAboveUtilization',
    path: ['stopBelowUtilization'],
  });
export type BurstPolicy = z.infer<typeof BurstPolicy>;

/**
 * One create request in a burst trace. A trace file is JSON lines: an optional first
 * line `TraceHeader` (recognised by its `format` field), then one `TraceEvent` per line
 * in non-decreasing `atMs` order. Unknown fields are ignored so recorders can add some.
 */
export const TraceEvent = z.object({
  /** Arrival, ms since the trace start. */
  atMs: z.number().min(0),
  cpuMillis: z.number().int().min(1),
  memoryMiB: z.number().int().min(1),
  /** Layer digests or names of the image (base included). */
  layers: z.array(z.string().min(1)).max(64),
  /** How long the sandbox lives once started. */
  lifetimeMs: z.number().min(0),
  /** The request asked to stay on local hosts. */
  stayLocal: z.boolean().optional(),
  tenant: z.string().optional(),
});
export type TraceEvent = z.infer<typeof TraceEvent>;

export const TRACE_FORMAT = 'rollbox-burst-trace';

export const TraceHeader = z.object({
  format: z.literal(TRACE_FORMAT),
  version: z.literal(1),
  /** Epoch ms of atMs = 0, when recorded from a live system. */
  startedAtEpochMs: z.number().optional(),
  durationMs: z.number().min(0).optional(),
  /** The layer set that was pre-synced to the cloud pool when the trace was made. */
  syncedLayers: z.array(z.string()).optional(),
  /** Who wrote it: `generator` (with its options) or `recorder`. */
  source: z.string().optional(),
  seed: z.number().optional(),
  options: z.record(z.string(), z.unknown()).optional(),
});
export type TraceHeader = z.infer<typeof TraceHeader>;

/** Why a create went where it went (see decideCreate in src/burst/policy). */
export const BurstDecisionReason = z.enum(['not_diverting', 'stay_local', 'layers_not_synced', 'share', 'diverted']);
export type BurstDecisionReason = z.infer<typeof BurstDecisionReason>;

export const CloudHostState = z.enum(['provisioning', 'ready', 'terminating']);
export type CloudHostState = z.infer<typeof CloudHostState>;

export const BurstCloudHost = z.object({
  id: z.string(),
  state: CloudHostState,
  sandboxes: z.number().int(),
  slots: z.number().int(),
  provisionedAtMs: z.number(),
  /** Since when it has had no sandboxes; null while busy or provisioning. */
  idleSinceMs: z.number().nullable(),
});
export type BurstCloudHost = z.infer<typeof BurstCloudHost>;

/** GET /v1/burst. */
export const BurstStatus = z.object({
  diverting: z.boolean(),
  divertingSinceMs: z.number().nullable(),
  /** Utilization of the local pool as of `utilizationAtMs` (its heartbeats), 0..1. */
  utilization: z.number(),
  utilizationAtMs: z.number(),
  policy: BurstPolicy,
  syncedLayers: z.array(z.string()),
  counts: z.object({
    diverted: z.number().int(),
    /** Every create that stayed local, whatever the reason. */
    local: z.number().int(),
    /** Stayed local while diverting because of layers or stayLocal. */
    ineligible: z.number().int(),
    byReason: z.record(BurstDecisionReason, z.number().int()),
  }),
  /** Cloud VM-hours so far: retired hosts' provisioned time plus the live hosts' (as the leading controller counted them). */
  vmHours: z.number(),
  cloudHosts: z.array(BurstCloudHost),
});
export type BurstStatus = z.infer<typeof BurstStatus>;
