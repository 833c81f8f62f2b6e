import type { RefusalCounts, SignalFigures, SignalSeries } from '../../api/index.ts';
import { SIGNAL_BUCKET_SECONDS, binUpperMs, type SignalBucket, type SignalHistogram } from '../../registry/index.ts';

/** Which create error codes count as which refusal cause. */
export const REFUSAL_CAUSES: Record<string, keyof RefusalCounts> = {
  quota_exceeded: 'quota',
  no_capacity: 'no_capacity',
  admission_exhausted: 'no_capacity',
  network_unavailable: 'network',
};

/** Counters summed over buckets; maxima kept as maxima. */
export function mergeBuckets(buckets: readonly SignalBucket[]): Record<string, number> {
  const merged: Record<string, number> = {};
  for (const { fields } of buckets) {
    for (const [field, value] of Object.entries(fields)) {
      merged[field] = field.startsWith('peak') ? Math.max(merged[field] ?? -Infinity, value) : (merged[field] ?? 0) + value;
    }
  }
  return merged;
}

/**
 * The q-quantile of a log-binned histogram: the bin holding it, interpolated linearly
 * inside the bin (as Prometheus' histogram_quantile does). Null with no samples.
 */
export function quantileOf(fields: Record<string, number>, histogram: SignalHistogram, q: number): number | null {
  const n = fields[`${histogram}:n`] ?? 0;
  if (n <= 0) return null;
  const prefix = `${histogram}:b`;
  const bins = Object.entries(fields)
    .filter(([k]) => k.startsWith(prefix))
    .map(([k, count]) => [Number(k.slice(prefix.length)), count] as const)
    .sort((a, b) => a[0] - b[0]);
  const rank = q * n;
  let below = 0;
  for (const [bin, count] of bins) {
    if (below + count >= rank) {
      const lower = bin === 0 ? 0 : binUpperMs(bin - 1);
      const upper = binUpperMs(bin);
      return lower + (upper - lower) * Math.min(1, Math.max(0, (rank - below) / count));
    }
    below += count;
  }
  return binUpperMs(bins.at(-1)?.[0] ?? 0);
}

export function meanOf(fields: Record<string, number>, histogram: SignalHistogram): number | null {
  const n = fields[`${histogram}:n`] ?? 0;
  return n > 0 ? (fields[`${histogram}:sum`] ?? 0) / n : null;
}

export function refusalsOf(fields: Record<string, number>): RefusalCounts {
  const counts: RefusalCounts = { quota: 0, no_capacity: 0, network: 0 };
  for (const [code, cause] of Object.entries(REFUSAL_CAUSES)) counts[cause] += fields[`refused:${code}`] ?? 0;
  return counts;
}

const round = (x: number | null, digits = 1) => (x === null ? null : Math.round(x * 10 ** digits) / 10 ** digits);

/** The figures of one span from its buckets' counters. */
export function figuresOf(startMs: number, seconds: number, fields: Record<string, number>): SignalFigures {
  const admitted = fields.admitted ?? 0;
  const tasks = fields.tasks ?? 0;
  return {
    startMs,
    seconds,
    createsPerSecond: round(admitted / seconds, 3)!,
    admitted,
    waitP50Ms: round(quantileOf(fields, 'wait', 0.5)),
    waitP99Ms: round(quantileOf(fields, 'wait', 0.99)),
    execs: fields['exec:n'] ?? 0,
    execP50Ms: round(quantileOf(fields, 'exec', 0.5)),
    execP99Ms: round(quantileOf(fields, 'exec', 0.99)),
    ended: fields['res:n'] ?? 0,
    residenceMedianMs: round(quantileOf(fields, 'res', 0.5)),
    residenceMeanMs: round(meanOf(fields, 'res')),
    tasksPerSecond: round(tasks / seconds, 3)!,
    taskSuccessShare: tasks > 0 ? round((fields['tasks:ok'] ?? 0) / tasks, 3) : null,
    refusals: refusalsOf(fields),
    peakLive: fields.peakLive ?? null,
    peakPerNode: fields.peakNode ?? null,
  };
}

/** Chart points of `stepSeconds` (a multiple of the bucket width) over [fromMs, toMs), and the window's total. */
export function seriesOf(buckets: readonly SignalBucket[], fromMs: number, toMs: number, stepSeconds: number): SignalSeries {
  const step = Math.max(SIGNAL_BUCKET_SECONDS, Math.round(stepSeconds / SIGNAL_BUCKET_SECONDS) * SIGNAL_BUCKET_SECONDS);
  const firstMs = Math.floor(fromMs / (step * 1000)) * step * 1000;
  const points: SignalFigures[] = [];
  for (let startMs = firstMs; startMs < toMs; startMs += step * 1000) {
    const inStep = buckets.filter((b) => b.startMs >= startMs && b.startMs < startMs + step * 1000);
    points.push(figuresOf(startMs, step, mergeBuckets(inStep)));
  }
  const seconds = Math.max(1, (toMs - fromMs) / 1000);
  return { fromMs, toMs, stepSeconds: step, points, total: figuresOf(fromMs, seconds, mergeBuckets(buckets)) };
}
