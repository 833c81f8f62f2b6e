import { Counter, Gauge, type Registry } from 'prom-client';
import type { SharedState } from './state.ts';

/** The controller's Prometheus metrics; gauges read the shared state when scraped. */
export function burstMetrics(registry: Registry, state: () => SharedState) {
  const creates = new Counter({ name: 'rollbox_burst_creates_total', help: 'create requests by where burst routing sent them and the policy reason', labelNames: ['target', 'reason'] as const, registers: [registry] });
  const fallbacks = new Counter({ name: 'rollbox_burst_fallbacks_total', help: 'diverted creates that found no cloud host in time and went local', registers: [registry] });
  const provisions = new Counter({ name: 'rollbox_burst_provisions_total', help: 'cloud host provisioning attempts by outcome', labelNames: ['outcome'] as const, registers: [registry] });
  new Gauge({
    name: 'rollbox_burst_local_utilization',
    help: 'local pool utilization as the burst controller last computed it',
    registers: [registry],
    collect() {
      this.set(state().utilization);
    },
  });
  new Gauge({
    name: 'rollbox_burst_diverting',
    help: '1 while eligible creates are diverted to the cloud pool',
    registers: [registry],
    collect() {
      this.set(state().diversion.diverting ? 1 : 0);
    },
  });
  new Gauge({
    name: 'rollbox_burst_cloud_hosts',
    help: 'cloud hosts by state',
    labelNames: ['state'] as const,
    registers: [registry],
    collect() {
      this.reset();
      for (const s of ['provisioning', 'ready', 'terminating'] as const) this.set({ state: s }, state().hosts.filter((h) => h.state === s).length);
    },
  });
  return { creates, fallbacks, provisions };
}

export type BurstMetrics = ReturnType<typeof burstMetrics>;
