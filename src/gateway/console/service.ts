import { BurstPolicy, type BurstStatus, type BurstSimulation, type BurstSimulationRequest, type CapacityQuery, type CapacityReport, type ConsoleQuery, type ConsoleSnapshot, type NodeList, type Pool, type RecentCreate } from '../../api/index.ts';
import { SimModel, runSweep, simulate, sweepSvg } from '../../burst/sim/index.ts';
import { DEFAULT_TRACE_OPTIONS, generateTrace } from '../../burst/trace/index.ts';
import { SIGNAL_BUCKET_SECONDS, bucketStartSecOf, type SignalStore } from '../../registry/index.ts';
import { capacityOf } from './capacity.ts';
import { seriesOf } from './figures.ts';

export interface ConsoleServiceDeps {
  signals: Pick<SignalStore, 'read'>;
  nodes: () => NodeList['nodes'];
  pools: () => Promise<Pool[]>;
  /** The latest creates, newest first. */
  recent: (limit: number) => Promise<RecentCreate[]>;
  /** The jobs whose rollouts ended last, latest first (src/rollouts' JobRolloutTimesStore). */
  rolloutJobs: (limit: number) => Promise<ConsoleSnapshot['rolloutJobs']>;
  burst?: { status(): Promise<BurstStatus> };
  /** The local pool's name: cloud hosts are not counted as nodes to size. */
  localPool: string;
  capacity: { safePerNode?: number; headroom: number };
  now: () => number;
}

/** About 60 points on a chart, whatever the window. */
const CHART_POINTS = 60;
/** Latest creates listed (each costs one record read per poll of an open page). */
const RECENT_CREATES = 20;
/** Jobs charted (each costs one hash read per poll of an open page). */
const ROLLOUT_JOBS = 12;

/**
 * A window of whole buckets ending where the bucket holding `endMs` starts: every figure
 * is over complete buckets (the one being filled would read as a dip in every rate).
 */
export function windowOf(endMs: number, windowSeconds: number): { fromMs: number; toMs: number } {
  const toMs = bucketStartSecOf(endMs) * 1000;
  return { fromMs: toMs - Math.ceil(windowSeconds / SIGNAL_BUCKET_SECONDS) * SIGNAL_BUCKET_SECONDS * 1000, toMs };
}

/** The console's figures: signals over time, capacity, and the cluster's live state. */
export class ConsoleService {
  constructor(private readonly deps: ConsoleServiceDeps) {}

  async capacity(query: CapacityQuery): Promise<CapacityReport> {
    const { fromMs, toMs } = windowOf(query.endMs ?? this.deps.now(), query.windowSeconds);
    const buckets = await this.deps.signals.read(fromMs, toMs);
    const nodes = this.deps.nodes().filter((n) => n.healthy && n.pool === this.deps.localPool);
    return capacityOf({
      buckets,
      fromMs,
      toMs,
      nodes,
      safePerNode: { ...(query.safePerNode !== undefined ? { fromQuery: query.safePerNode } : {}), ...(this.deps.capacity.safePerNode !== undefined ? { fromOperator: this.deps.capacity.safePerNode } : {}) },
      headroom: query.headroom ?? this.deps.capacity.headroom,
    });
  }

  async snapshot(query: ConsoleQuery): Promise<ConsoleSnapshot> {
    const atMs = this.deps.now();
    const { fromMs, toMs } = windowOf(atMs, query.windowSeconds);
    const [buckets, pools, recent, rolloutJobs, burst, capacity] = await Promise.all([
      this.deps.signals.read(fromMs, toMs),
      this.deps.pools(),
      this.deps.recent(RECENT_CREATES),
      this.deps.rolloutJobs(ROLLOUT_JOBS),
      this.deps.burst ? this.deps.burst.status() : Promise.resolve(null),
      this.capacity({ windowSeconds: query.capacityWindowSeconds, endMs: atMs, safePerNode: query.safePerNode, headroom: query.headroom }),
    ]);
    return { atMs, nodes: this.deps.nodes(), pools, burst, signals: seriesOf(buckets, fromMs, toMs, query.windowSeconds / CHART_POINTS), capacity, recent, rolloutJobs };
  }

  /**
   * The current burst policy replayed over a generated trace, and a sweep of thresholds and
   * VM caps around it. Runs on the event loop: the request's bounds keep it well under a
   * second (20 minutes of trace, 15 replays: about 0.3 s here).
   */
  async simulate(request: BurstSimulationRequest): Promise<BurstSimulation> {
    const started = performance.now();
    const policy = this.deps.burst ? (await this.deps.burst.status()).policy : BurstPolicy.parse({});
    const durationMs = request.traceMinutes * 60_000;
    const { header, events } = generateTrace({ ...DEFAULT_TRACE_OPTIONS, durationMs, seed: request.seed });
    const synced = new Set(header.syncedLayers ?? []);
    const model = SimModel.parse({});
    const result = simulate(events, policy, model, synced);
    const gap = Math.max(0, Math.round((policy.divertAboveUtilization - policy.stopBelowUtilization) * 1000) / 1000);
    const rows = runSweep(events, synced, policy, model, { thresholds: request.thresholds, gaps: [gap], caps: request.caps });
    return {
      trace: { source: 'generated', seed: request.seed, creates: events.length, seconds: durationMs / 1000 },
      result: { ...result },
      sweep: rows.map((r) => ({ divertAboveUtilization: r.divertAboveUtilization, maxCloudHosts: r.maxCloudHosts, queueWaitP99Ms: r.result.queueWaitP99Ms, cloudVmHours: r.result.cloudVmHours })),
      sweepSvg: sweepSvg(rows, gap, `${request.traceMinutes} min generated trace, seed ${request.seed}`),
      elapsedMs: Math.round(performance.now() - started),
    };
  }
}
