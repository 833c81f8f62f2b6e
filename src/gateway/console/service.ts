import { BurstPolicy, type BurstStatus, type BurstSimulation, type BurstSimulationRequest, type CapacityQuery, type CapacityReport, type ConsoleQuery, type ConsoleSnapshot, type NodeList, type Pool } from '../../api/index.ts';
import { SimModel, runSweep, simulate, sweepSvg } from '../../burst/sim/index.ts';
import { DEFAULT_TRACE_OPTIONS, generateTrace } from '../../burst/trace/index.ts';
import type { SignalStore } from '../../registry/index.ts';
import { capacityOf } from './capacity.ts';
import { seriesOf } from './figures.ts';

export interface ConsoleServiceDeps {
  signals: Pick<SignalStore, 'read'>;
  nodes: () => NodeList['nodes'];
  pools: () => Promise<Pool[]>;
  burst?: { status(): Promise<BurstStatus> };
  /** The local pool's name: cloud hosts are not counted as nodes to size. */
  localPool: string;
  capacity: { safePerNode?: number; headroom: number };
  now: () => number;
}

/** About 60 points on a chart, whatever the window. */
const CHART_POINTS = 60;

/** The console's figures: signals over time, capacity, and the cluster's live state. */
export class ConsoleService {
  constructor(private readonly deps: ConsoleServiceDeps) {}

  async capacity(query: CapacityQuery): Promise<CapacityReport> {
    const toMs = query.endMs ?? this.deps.now();
    const fromMs = toMs - query.windowSeconds * 1000;
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
    const fromMs = atMs - query.windowSeconds * 1000;
    const [buckets, pools, burst, capacity] = await Promise.all([
      this.deps.signals.read(fromMs, atMs),
      this.deps.pools(),
      this.deps.burst ? this.deps.burst.status() : Promise.resolve(null),
      this.capacity({ windowSeconds: query.capacityWindowSeconds, endMs: atMs, safePerNode: query.safePerNode, headroom: query.headroom }),
    ]);
    return { atMs, nodes: this.deps.nodes(), pools, burst, signals: seriesOf(buckets, fromMs, atMs, query.windowSeconds / CHART_POINTS), capacity };
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
