import { Gauge, type Registry } from 'prom-client';
import type { CapacityReport } from '../../api/index.ts';
import type { ConsoleService } from './service.ts';

/**
 * The capacity figures as Prometheus gauges, computed from the shared signals when
 * scraped (one read per scrape, however many gauges), so every gateway reports the
 * cluster's figures, not only its own traffic.
 */
export function registerCapacityMetrics(registry: Registry, console: Pick<ConsoleService, 'capacity'>, windowSeconds: number): void {
  let cached: { atMs: number; report: Promise<CapacityReport> } | undefined;
  const report = () => {
    const nowMs = Date.now();
    if (!cached || nowMs - cached.atMs > 1000) cached = { atMs: nowMs, report: console.capacity({ windowSeconds }) };
    return cached.report;
  };
  const gauge = (name: string, help: string, value: (r: CapacityReport) => number | null) =>
    new Gauge({
      name,
      help: `${help} (over the last ${windowSeconds} s, ROLLBOX_CAPACITY_WINDOW_SECONDS)`,
      registers: [registry],
      async collect() {
        const v = value(await report());
        this.reset();
        if (v !== null) this.set(v);
      },
    });
  gauge('rollbox_capacity_admission_rate', 'creates admitted per second, cluster-wide', (r) => r.admissionRatePerSecond);
  gauge('rollbox_sandbox_residence_mean_seconds', 'mean residence (running to ended) of the sandboxes that ended', (r) => r.meanResidenceSeconds);
  gauge('rollbox_sandbox_residence_median_seconds', 'median residence of the sandboxes that ended', (r) => r.medianResidenceSeconds);
  gauge('rollbox_capacity_estimated_concurrency', "Little's law: admission rate x mean residence", (r) => r.estimatedConcurrency);
  gauge('rollbox_capacity_live_sandboxes', 'live sandboxes in the local pool now, warm pools apart', (r) => r.liveSandboxes);
  gauge('rollbox_capacity_resident_pool', 'warm pools\' ready and starting sandboxes now', (r) => r.residentPool);
  gauge('rollbox_capacity_safe_per_node', 'sandboxes one node carries safely (operator setting or observed peak without refusals)', (r) => r.safePerNode.sandboxes);
  gauge('rollbox_capacity_nodes', 'healthy local worker hosts now', (r) => r.nodes);
  gauge('rollbox_capacity_nodes_needed', 'nodes needed for the estimated concurrency with headroom', (r) => r.nodesNeeded);
}
