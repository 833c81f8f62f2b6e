export function percentile(sortedMs: readonly number[], p: number): number {
  if (sortedMs.length === 0) return NaN;
  const index = Math.min(sortedMs.length - 1, Math.max(0, Math.ceil((p / 100) * sortedMs.length) - 1));
  return sortedMs[index]!;
}

export function summarize(samplesMs: readonly number[]): { p50Ms: number; p90Ms: number; p99Ms: number; meanMs: number; n: number } {
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

/** A one-line progress bar on stderr (benches print their JSON result on stdout). */
export function progress(label: string, total: number): { tick(): void; done(): void } {
  let count = 0;
  const draw = () => {
    const width = 30;
    const filled = Math.round((count / total) * width);
    process.stderr.write(`\r${label.padEnd(28)} [${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${count}/${total}`);
  };
  draw();
  return {
    tick() {
      count++;
      if (count === total || count % Math.max(1, Math.floor(total / 50)) === 0) draw();
    },
    done() {
      draw();
      process.stderr.write('\n');
    },
  };
}
