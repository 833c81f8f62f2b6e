/** Nearest-rank percentile of an ascending array (NaN when empty). */
export function percentile(sorted: ArrayLike<number>, p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

export interface LatencySummary {
  p50Ms: number;
  p90Ms: number;
  p99Ms: number;
  meanMs: number;
  n: number;
}

/** p50/p90/p99 and mean of latency samples, rounded to 0.01 ms. */
export function summarize(samplesMs: readonly number[]): LatencySummary {
  const sorted = [...samplesMs].sort((a, b) => a - b);
  const round = (x: number) => Math.round(x * 100) / 100;
  return {
    p50Ms: round(percentile(sorted, 50)),
    p90Ms: round(percentile(sorted, 90)),
    p99Ms: round(percentile(sorted, 99)),
    meanMs: round(sorted.reduce((a, b) => a + b, 0) / Math.max(1, sorted.length)),
    n: sorted.length,
  };
}
