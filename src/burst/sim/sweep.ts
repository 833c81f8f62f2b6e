import { BurstPolicy, type TraceEvent } from '../../api/index.ts';
import { lineChartsSvg } from '../../report/index.ts';
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
  /** Share of the whole sweep done (0..1), runs finished, runs in all. */
  onProgress?: (doneFraction: number, runsDone: number, runs: number) => void,
): SweepRow[] {
  const rows: SweepRow[] = [];
  const total = grid.thresholds.length * grid.gaps.length * grid.caps.length;
  for (const cap of grid.caps) {
    for (const gap of grid.gaps) {
      for (const threshold of grid.thresholds) {
        const stopBelow = Math.max(0, Math.round((threshold - gap) * 1000) / 1000);
        const policy = BurstPolicy.parse({ ...basePolicy, divertAboveUtilization: threshold, stopBelowUtilization: stopBelow, maxCloudHosts: cap });
        const done = rows.length;
        const result = simulate(events, policy, model, syncedLayers, { onProgress: (f) => onProgress?.((done + f) / total, done, total) });
        rows.push({ divertAboveUtilization: threshold, stopBelowUtilization: stopBelow, gap, maxCloudHosts: cap, result });
      }
    }
  }
  onProgress?.(1, total, total);
  return rows;
}

/** A cap step on which more cloud hosts did not help: a wait statistic rose. */
export interface CapStepRise {
  divertAboveUtilization: number;
  stopBelowUtilization: number;
  capFrom: number;
  capTo: number;
  metric: 'queueWaitP50Ms' | 'queueWaitP99Ms' | 'queueWaitMeanMs';
  beforeMs: number;
  afterMs: number;
  /** Creates gave up at either cap: reneging is one known cause (README, burst). */
  gaveUp: boolean;
}

const WAIT_METRICS = ['queueWaitP50Ms', 'queueWaitP99Ms', 'queueWaitMeanMs'] as const;

/**
 * Every step to the next larger cap, at the same threshold and gap, on which queue wait
 * p50, p99 or mean rose. More VMs need not help on every trace (give-ups, mixed request
 * sizes, diverted creates taking local slots; README, burst): this shows an operator where.
 */
export function capStepRises(rows: readonly SweepRow[]): CapStepRise[] {
  const groups = new Map<string, SweepRow[]>();
  for (const row of rows) {
    const key = `${row.divertAboveUtilization}/${row.stopBelowUtilization}`;
    groups.set(key, [...(groups.get(key) ?? []), row]);
  }
  const rises: CapStepRise[] = [];
  for (const group of groups.values()) {
    const byCap = [...group].sort((a, b) => a.maxCloudHosts - b.maxCloudHosts);
    for (let k = 1; k < byCap.length; k++) {
      const from = byCap[k - 1]!;
      const to = byCap[k]!;
      if (to.maxCloudHosts === from.maxCloudHosts) continue;
      for (const metric of WAIT_METRICS) {
        if (to.result[metric] <= from.result[metric]) continue;
        rises.push({
          divertAboveUtilization: to.divertAboveUtilization,
          stopBelowUtilization: to.stopBelowUtilization,
          capFrom: from.maxCloudHosts,
          capTo: to.maxCloudHosts,
          metric,
          beforeMs: from.result[metric],
          afterMs: to.result[metric],
          gaveUp: from.result.refused > 0 || to.result.refused > 0,
        });
      }
    }
  }
  return rises;
}

/** One line per rise, for stderr. */
export function capStepRiseLine(rise: CapStepRise): string {
  const name = { queueWaitP50Ms: 'p50', queueWaitP99Ms: 'p99', queueWaitMeanMs: 'mean' }[rise.metric];
  const percent = rise.beforeMs > 0 ? ` (+${(((rise.afterMs - rise.beforeMs) / rise.beforeMs) * 100).toFixed(1)}%)` : '';
  return `more cloud hosts did not help: threshold ${rise.divertAboveUtilization} stopBelow ${rise.stopBelowUtilization}, cap ${rise.capFrom} -> ${rise.capTo}: wait ${name} ${(rise.beforeMs / 1000).toFixed(1)} s -> ${(rise.afterMs / 1000).toFixed(1)} s${percent}${rise.gaveUp ? ', creates gave up' : ''}`;
}

const CSV_RESULT_COLUMNS = [
  'queueWaitP50Ms',
  'queueWaitP99Ms',
  'queueWaitMeanMs',
  'cloudVmHours',
  'peakCloudHosts',
  'overflow',
  'overflowAbsorbedShare',
  'noLocalRoomAtArrival',
  'diverted',
  'divertedFellBackLocal',
  'ineligible',
  'refused',
  'startedLocal',
  'startedCloud',
  'divertingTimeShare',
  'meanUtilization',
] as const satisfies readonly (keyof SimResult)[];

/**
 * The last column, waitRoseVsSmallerCap, names the wait statistics that rose against the
 * next smaller cap at the same threshold and gap (e.g. `p99;mean`), empty when none did.
 */
export function sweepCsv(rows: readonly SweepRow[]): string {
  const rose = new Map<string, string[]>();
  for (const rise of capStepRises(rows)) {
    const key = `${rise.divertAboveUtilization}/${rise.stopBelowUtilization}/${rise.capTo}`;
    rose.set(key, [...(rose.get(key) ?? []), { queueWaitP50Ms: 'p50', queueWaitP99Ms: 'p99', queueWaitMeanMs: 'mean' }[rise.metric]]);
  }
  const header = ['divertAboveUtilization', 'stopBelowUtilization', 'gap', 'maxCloudHosts', ...CSV_RESULT_COLUMNS, 'waitRoseVsSmallerCap'].join(',');
  const lines = rows.map((r) =>
    [r.divertAboveUtilization, r.stopBelowUtilization, r.gap, r.maxCloudHosts, ...CSV_RESULT_COLUMNS.map((c) => r.result[c]), (rose.get(`${r.divertAboveUtilization}/${r.stopBelowUtilization}/${r.maxCloudHosts}`) ?? []).join(';')].join(','),
  );
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
