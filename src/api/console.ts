import { z } from 'zod';
import { BurstStatus } from './burst.ts';
import { NodeHeartbeat } from './node.ts';
import { Pool } from './pool.ts';
import { JobRolloutTimes } from './rollout.ts';

/** A figure that needs samples: null when the window held none. */
const Maybe = z.number().nullable();

/** Refused creates grouped by cause: the tenant's quota, no worker host with room (or every one refused), no host whose allowlist network works. */
export const RefusalCounts = z.object({ quota: z.number().int(), no_capacity: z.number().int(), network: z.number().int() });
export type RefusalCounts = z.infer<typeof RefusalCounts>;

/** The seed's signals over one span of time (a chart point, or a whole window). */
export const SignalFigures = z.object({
  startMs: z.number(),
  seconds: z.number(),
  /** Creates admitted (ended running, replays not counted), per second. */
  createsPerSecond: z.number(),
  admitted: z.number().int(),
  /** Environment-creation wait: the create request's arrival to its sandbox running. */
  waitP50Ms: Maybe,
  waitP99Ms: Maybe,
  /** Tool execution time: exec durations as the worker measured them. */
  execs: z.number().int(),
  execP50Ms: Maybe,
  execP99Ms: Maybe,
  /** Residence (running to ended) of sandboxes that ended in the span; median and mean differ on long tails. */
  ended: z.number().int(),
  residenceMedianMs: Maybe,
  residenceMeanMs: Maybe,
  /** Batch tasks that ended, per second, and the share of them that succeeded. */
  tasksPerSecond: z.number(),
  taskSuccessShare: Maybe,
  refusals: RefusalCounts,
  /** The most live sandboxes any gateway saw in the cluster's heartbeats, and on one node, during the span. */
  peakLive: Maybe,
  peakPerNode: Maybe,
});
export type SignalFigures = z.infer<typeof SignalFigures>;

export const SignalSeries = z.object({
  fromMs: z.number(),
  toMs: z.number(),
  stepSeconds: z.number().int(),
  points: z.array(SignalFigures),
  /** The whole window at once (quantiles over every sample, not averaged from the points). */
  total: SignalFigures,
});
export type SignalSeries = z.infer<typeof SignalSeries>;

export const CapacityQuery = z.strictObject({
  /** The stable window the estimate uses (whole 10 s buckets), ending where the bucket holding `endMs` (default now) starts. */
  windowSeconds: z.coerce.number().int().min(10).max(10_800).default(300),
  endMs: z.coerce.number().int().min(0).optional(),
  /** Sandboxes one node carries safely (overrides ROLLBOX_CAPACITY_SAFE_PER_NODE and the observed peak). */
  safePerNode: z.coerce.number().positive().max(1_000_000).optional(),
  /** Capacity kept above the estimated concurrency: nodes needed = ceil(concurrency x headroom / safe per node). */
  headroom: z.coerce.number().min(1).max(10).optional(),
});
export type CapacityQuery = z.infer<typeof CapacityQuery>;

export const CapacityScenario = z.object({
  nodes: z.number().int(),
  /** nodes x safe per node. */
  safeSandboxes: Maybe,
  /** (estimated concurrency + resident pool) / safeSandboxes. */
  utilization: Maybe,
  /** utilization x headroom <= 1. */
  meetsHeadroom: z.boolean().nullable(),
});
export type CapacityScenario = z.infer<typeof CapacityScenario>;

/** GET /v1/cluster/capacity: Little's law over a stable window, with every input it used. */
export const CapacityReport = z.object({
  window: z.object({ fromMs: z.number(), toMs: z.number(), seconds: z.number() }),
  /** lambda: creates admitted in the window / its seconds. */
  admissionRatePerSecond: z.number(),
  admitted: z.number().int(),
  /** W: mean residence of the sandboxes that ended in the window (not from a warm pool), and how many that was. */
  meanResidenceSeconds: Maybe,
  medianResidenceSeconds: Maybe,
  residenceSamples: z.number().int(),
  /** L = lambda x W, the average concurrency; null without residence samples. */
  estimatedConcurrency: Maybe,
  /** Live sandboxes now (heartbeats), warm pools' ready and starting sandboxes counted apart. */
  liveSandboxes: z.number().int(),
  residentPool: z.number().int(),
  safePerNode: z.object({
    sandboxes: Maybe,
    source: z.enum(['query', 'operator', 'observed_peak', 'none']),
    /** The most sandboxes one node held in a bucket of the window with no refusal for capacity. */
    observedPeakWithoutRefusals: Maybe,
  }),
  headroom: z.number(),
  /** Healthy local worker hosts now. */
  nodes: z.number().int(),
  /** ceil((L + resident pool) x headroom / safe per node). */
  nodesNeeded: z.number().int().nullable(),
  /** One node fewer, now, one more. */
  scenarios: z.array(CapacityScenario),
  refusals: RefusalCounts,
  /** The figures in words, inputs included. */
  explanation: z.string(),
});
export type CapacityReport = z.infer<typeof CapacityReport>;

export const ConsoleQuery = z.strictObject({
  /** The span the charts cover, ending now. */
  windowSeconds: z.coerce.number().int().min(60).max(10_800).default(900),
  capacityWindowSeconds: CapacityQuery.shape.windowSeconds,
  safePerNode: CapacityQuery.shape.safePerNode,
  headroom: CapacityQuery.shape.headroom,
});
export type ConsoleQuery = z.infer<typeof ConsoleQuery>;

/** One of the latest creates (from the burst trace stream), with what became of it. */
export const RecentCreate = z.object({
  atMs: z.number(),
  tenant: z.string(),
  /** Absent: refused before a sandbox existed. */
  sandboxId: z.string().optional(),
  state: z.string().optional(),
  node: z.string().optional(),
  pool: z.string().optional(),
  labels: z.record(z.string(), z.string()),
});
export type RecentCreate = z.infer<typeof RecentCreate>;

/** GET /v1/cluster/console: what the console page shows, in one answer. */
export const ConsoleSnapshot = z.object({
  atMs: z.number(),
  nodes: z.array(NodeHeartbeat.extend({ ageMs: z.number() })),
  pools: z.array(Pool),
  /** Null where cloud burst is not enabled on this gateway. */
  burst: BurstStatus.nullable(),
  signals: SignalSeries,
  capacity: CapacityReport,
  /** The latest creates, newest first (at most 20). */
  recent: z.array(RecentCreate),
  /** The training jobs whose hosted rollouts ended last (at most 12, latest first), every tenant's: where their rollouts' time went. */
  rolloutJobs: z.array(JobRolloutTimes.extend({ tenant: z.string() })),
});
export type ConsoleSnapshot = z.infer<typeof ConsoleSnapshot>;

export const BurstSimulationRequest = z.strictObject({
  /** Minutes of generated trace to replay (src/burst/trace's generator, default shape). */
  traceMinutes: z.number().int().min(1).max(120).default(20),
  thresholds: z.array(z.number().min(0).max(1)).min(1).max(12).default([0.6, 0.7, 0.8, 0.9, 1]),
  caps: z.array(z.number().int().min(0).max(64)).min(1).max(5).default([0, 2, 4]),
  seed: z.number().int().default(1),
});
export type BurstSimulationRequest = z.infer<typeof BurstSimulationRequest>;

/** POST /v1/burst/simulation: the current policy replayed, and a sweep around it, as figures and SVG charts. */
export const BurstSimulation = z.object({
  trace: z.object({ source: z.literal('generated'), seed: z.number().int(), creates: z.number().int(), seconds: z.number() }),
  /** The current policy's replay (SimResult's figures). */
  result: z.record(z.string(), z.unknown()),
  sweep: z.array(z.object({ divertAboveUtilization: z.number(), maxCloudHosts: z.number().int(), queueWaitP99Ms: z.number(), cloudVmHours: z.number() })),
  /** Image/svg+xml documents (shown as images: their text stays text). */
  sweepSvg: z.string(),
  elapsedMs: z.number(),
});
export type BurstSimulation = z.infer<typeof BurstSimulation>;
