import { BurstPolicy, type TraceEvent } from '../../api/index.ts';
import { lineChartsSvg } from './chart.ts';
import type { SimModel, SimResult } from './model.ts';
import { simulate } from './simulate.ts';

export interface SweepGrid {
  /** divertAboveUtilization values. */
  thresholds: number[];
  /** Hysteresis gaps: stopBelow = threshold - gap (at least 0). */
  gaps: number[];
  /** maxCloudHosts values. */
  caps: number[];
}

export interface SweepRow {
  divertAboveUtilization: number;
  stopBelowUtilization: number;
  gap: number;
  maxCloudHosts: number;
  result: SimResult;
}

/** Every combination of the grid, each a full replay with the same trace and seed. */
export function runSweep(
  events: readonly TraceEvent[],
  syncedLayers: ReadonlySet<string>,
  basePolicy: BurstPolicy,
  model: SimModel,
  grid: SweepGrid,
  onRun?: (done: number, total: number) => void,
): SweepRow[] {
  const rows: SweepRow[] = [];
  const total = grid.thresholds.length * grid.gaps.length * grid.caps.length;
  for (const cap of grid.caps) {
    for (const gap of grid.gaps) {
      for (const threshold of grid.thresholds) {
        const stopBelow = Math.max(0, Math.round((threshold - gap) * 1000) / 1000);
        const policy = BurstPolicy.parse({ ...basePolicy, divertAboveUtilization: threshold, stopBelowUtilization: stopBelow, maxCloudHosts: cap });
        rows.push({ divertAboveUtilization: threshold, stopBelowUtilization: stopBelow, gap, maxCloudHosts: cap, result: simulate(events, policy, model, syncedLayers) });
        onRun?.(rows.length, total);
      }
    }
  }
  return rows;
}

const CSV_RESULT_COLUMNS = [
  'queueWaitP50Ms',
  'queueWaitP99Ms',
  'queueWaitMeanMs',
  'cloudVmHours',
  'peakCloudHosts',
  'overflow',
  'overflowAbsorbedShare',
  'diverted',
  'divertedFellBackLocal',
  'ineligible',
  'refused',
  'startedLocal',
  'startedCloud',
  'divertingTimeShare',
  'meanUtilization',
] as const satisfies readonly (keyof SimResult)[];

export function sweepCsv(rows: readonly SweepRow[]): string {
  const header = ['divertAboveUtilization', 'stopBelowUtilization', 'gap', 'maxCloudHosts', ...CSV_RESULT_COLUMNS].join(',');
  const lines = rows.map((r) => [r.divertAboveUtilization, r.stopBelowUtilization, r.gap, r.maxCloudHosts, ...CSV_RESULT_COLUMNS.map((c) => r.result[c])].join(','));
  return `${[header, ...lines].join('\n')}\n`;
}

/**
 * Queue wait p99 and cloud VM-hours against the diversion threshold, one line per VM cap,
 * at one hysteresis gap (the sweep's other gaps are in the CSV).
 */
export function sweepSvg(rows: readonly SweepRow[], gap: number, traceLabel: string): string {
  const atGap = rows.filter((r) => r.gap === gap);
  const caps = [...new Set(atGap.map((r) => r.maxCloudHosts))];
  const series = (metric: (r: SimResult) => number) =>
    caps.map((cap) => ({ label: `max ${cap} cloud hosts`, points: atGap.filter((r) => r.maxCloudHosts === cap).map((r) => ({ x: r.divertAboveUtilization, y: metric(r.result) })) }));
  return lineChartsSvg(`Burst sweep: ${traceLabel} (hysteresis gap ${gap})`, 'divertAboveUtilization', [
    { title: 'queue wait p99', yLabel: 'seconds', series: series((r) => r.queueWaitP99Ms / 1000) },
    { title: 'cloud VM-hours', yLabel: 'VM-hours', series: series((r) => r.cloudVmHours) },
    { title: 'share of overflow absorbed by cloud', yLabel: 'share', series: series((r) => r.overflowAbsorbedShare) },
  ]);
}
