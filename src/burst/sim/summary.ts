import { REFUSED, STARTED_CLOUD, STARTED_LOCAL } from './events.ts';
import { percentile } from '../../report/index.ts';
import type { SimResult } from './model.ts';

export interface SimTotals {
  /** Per create: its outcome (events.ts) and queue wait. */
  outcome: Uint8Array;
  waitMs: Float64Array;
  counts: { diverted: number; divertedFellBackLocal: number; overflow: number; noLocalRoomAtArrival: number };
  byReason: Record<string, number>;
  cloudVmMs: number;
  peakCloudHosts: number;
  cloudProvisions: number;
  ticksDuringTrace: number;
  divertingTicks: number;
  utilizationSum: number;
  peakUtilization: number;
  simulatedMs: number;
  events: number;
}

/** A replay's result from its totals: outcomes counted, waits as percentiles, shares rounded. */
export function summarize(t: SimTotals): SimResult {
  const n = t.outcome.length;
  const sorted = t.waitMs.slice().sort();
  const waitPercentile = (p: number) => (n === 0 ? 0 : percentile(sorted, p));
  let startedLocal = 0;
  let startedCloud = 0;
  let refused = 0;
  let waited = 0;
  let waitSum = 0;
  for (let i = 0; i < n; i++) {
    if (t.outcome[i] === STARTED_LOCAL) startedLocal++;
    else if (t.outcome[i] === STARTED_CLOUD) startedCloud++;
    else if (t.outcome[i] === REFUSED) refused++;
    if (t.waitMs[i]! > 0) waited++;
    waitSum += t.waitMs[i]!;
  }
  const round = (x: number, digits = 0) => Math.round(x * 10 ** digits) / 10 ** digits;
  const { counts, byReason } = t;
  return {
    creates: n,
    startedLocal,
    startedCloud,
    refused,
    diverted: counts.diverted,
    divertedFellBackLocal: counts.divertedFellBackLocal,
    ineligible: byReason.stay_local! + byReason.layers_not_synced!,
    byReason,
    overflow: counts.overflow,
    overflowAbsorbedByCloud: startedCloud,
    overflowAbsorbedShare: round(counts.overflow === 0 ? 0 : startedCloud / counts.overflow, 4),
    noLocalRoomAtArrival: counts.noLocalRoomAtArrival,
    queueWaitP50Ms: round(waitPercentile(50)),
    queueWaitP99Ms: round(waitPercentile(99)),
    queueWaitMeanMs: round(n === 0 ? 0 : waitSum / n, 1),
    waited,
    cloudVmHours: round(t.cloudVmMs / 3_600_000, 3),
    peakCloudHosts: t.peakCloudHosts,
    cloudProvisions: t.cloudProvisions,
    divertingTimeShare: round(t.ticksDuringTrace === 0 ? 0 : t.divertingTicks / t.ticksDuringTrace, 4),
    meanUtilization: round(t.ticksDuringTrace === 0 ? 0 : t.utilizationSum / t.ticksDuringTrace, 4),
    peakUtilization: round(t.peakUtilization, 4),
    simulatedMs: t.simulatedMs,
    events: t.events,
  };
}
