import type { CapacityReport, CapacityScenario, NodeHeartbeat } from '../../api/index.ts';
import type { SignalBucket } from '../../registry/index.ts';
import { meanOf, mergeBuckets, quantileOf, refusalsOf } from './figures.ts';

export interface CapacityInput {
  buckets: readonly SignalBucket[];
  fromMs: number;
  toMs: number;
  /** Healthy worker hosts of the local pool, from the heartbeats. */
  nodes: readonly Pick<NodeHeartbeat, 'sandboxes' | 'pools'>[];
  safePerNode: { fromQuery?: number; fromOperator?: number };
  headroom: number;
}

/** Sandboxes of warm pools (ready and starting) on a host: residents counted apart from the traffic. */
export const residentPoolOf = (node: Pick<NodeHeartbeat, 'pools'>): number => Object.values(node.pools ?? {}).reduce((sum, p) => sum + p.ready + p.starting, 0);

const round = (x: number, digits = 3) => Math.round(x * 10 ** digits) / 10 ** digits;

/**
 * Little's law over a stable window (the seed: "average concurrency = admission rate x
 * average residence time"): lambda = creates admitted / window, W = mean residence of the
 * sandboxes that ended in it, L = lambda x W. Nodes needed = ceil((L + resident pool) x
 * headroom / safe per node), where safe per node is the operator's figure or else the most
 * sandboxes one node held in a bucket that saw no capacity refusal.
 */
export function capacityOf(input: CapacityInput): CapacityReport {
  const seconds = Math.max(1, (input.toMs - input.fromMs) / 1000);
  const fields = mergeBuckets(input.buckets);
  const admitted = fields.admitted ?? 0;
  const lambda = admitted / seconds;
  const meanMs = meanOf(fields, 'res');
  const medianMs = quantileOf(fields, 'res', 0.5);
  const concurrency = meanMs === null ? null : lambda * (meanMs / 1000);
  const calmPeaks = input.buckets.filter((b) => !b.fields['refused:no_capacity'] && !b.fields['refused:admission_exhausted'] && b.fields.peakNode !== undefined).map((b) => b.fields.peakNode!);
  const observedPeak = calmPeaks.length ? Math.max(...calmPeaks) : null;
  const safe = input.safePerNode.fromQuery ?? input.safePerNode.fromOperator ?? (observedPeak && observedPeak > 0 ? observedPeak : null);
  const source = input.safePerNode.fromQuery !== undefined ? 'query' : input.safePerNode.fromOperator !== undefined ? 'operator' : safe !== null ? 'observed_peak' : 'none';
  const residentPool = input.nodes.reduce((sum, n) => sum + residentPoolOf(n), 0);
  const liveSandboxes = Math.max(0, input.nodes.reduce((sum, n) => sum + n.sandboxes, 0) - residentPool);
  const demand = concurrency === null ? null : concurrency + residentPool;
  const nodesNeeded = demand === null || safe === null ? null : Math.max(1, Math.ceil((demand * input.headroom) / safe - 1e-9));
  const scenario = (nodes: number): CapacityScenario => {
    const safeSandboxes = safe === null ? null : nodes * safe;
    const utilization = demand === null || !safeSandboxes ? null : round(demand / safeSandboxes);
    return { nodes, safeSandboxes, utilization, meetsHeadroom: utilization === null ? null : utilization * input.headroom <= 1 + 1e-9 };
  };
  const n = input.nodes.length;
  const scenarios = [...(n > 0 ? [scenario(n - 1)] : []), scenario(n), scenario(n + 1)];
  const report: Omit<CapacityReport, 'explanation'> = {
    window: { fromMs: input.fromMs, toMs: input.toMs, seconds },
    admissionRatePerSecond: round(lambda),
    admitted,
    meanResidenceSeconds: meanMs === null ? null : round(meanMs / 1000),
    medianResidenceSeconds: medianMs === null ? null : round(medianMs / 1000),
    residenceSamples: fields['res:n'] ?? 0,
    estimatedConcurrency: concurrency === null ? null : round(concurrency, 2),
    liveSandboxes,
    residentPool,
    safePerNode: { sandboxes: safe, source, observedPeakWithoutRefusals: observedPeak },
    headroom: input.headroom,
    nodes: n,
    nodesNeeded,
    scenarios,
    refusals: refusalsOf(fields),
  };
  return { ...report, explanation: explain(report) };
}

function explain(r: Omit<CapacityReport, 'explanation'>): string {
  const window = `over the ${r.window.seconds} s window`;
  if (r.estimatedConcurrency === null) return `${r.admitted} creates admitted ${window} (${r.admissionRatePerSecond}/s) but no sandbox ended in it: no mean residence, so no Little's-law estimate yet. Choose a longer window.`;
  const parts = [
    `Admission rate ${r.admissionRatePerSecond}/s (${r.admitted} creates ${window}) x mean residence ${r.meanResidenceSeconds} s (${r.residenceSamples} sandboxes ended; median ${r.medianResidenceSeconds} s) = average concurrency ${r.estimatedConcurrency} (live now: ${r.liveSandboxes}; warm pools hold ${r.residentPool} more, counted apart).`,
  ];
  if (r.safePerNode.sandboxes === null) parts.push('No safe load per node: set ROLLBOX_CAPACITY_SAFE_PER_NODE (or ?safePerNode=), or let a window with traffic and no capacity refusal show one.');
  else {
    const from = r.safePerNode.source === 'observed_peak' ? 'the most one node held with no capacity refusal' : r.safePerNode.source === 'operator' ? 'the operator setting' : 'the query';
    parts.push(`Safe load ${r.safePerNode.sandboxes} sandboxes per node (${from}); with headroom x${r.headroom}: ${r.nodesNeeded} node(s) needed, ${r.nodes} healthy now.`);
    for (const s of r.scenarios) parts.push(`${s.nodes} node(s): utilization ${s.utilization === null ? '-' : Math.round(s.utilization * 100) + '%'}${s.meetsHeadroom ? ', within headroom' : ', short of headroom'}.`);
  }
  return parts.join(' ');
}
