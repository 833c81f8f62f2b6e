import { describe, expect, it } from 'vitest';
import { cdfChartSvg, lineChartsSvg, percentile, summarize } from './index.ts';

describe('report', () => {
  it('percentile is nearest-rank, on arrays and typed arrays', () => {
    const sorted = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
    expect(percentile(sorted, 50)).toBe(5);
    expect(percentile(sorted, 99)).toBe(10);
    expect(percentile(sorted, 0)).toBe(1);
    expect(percentile(Float64Array.from(sorted), 90)).toBe(9);
    expect(percentile([], 50)).toBeNaN();
    expect(summarize([3, 1, 2])).toEqual({ p50Ms: 2, p90Ms: 3, p99Ms: 3, meanMs: 2, n: 3 });
  });

  it('charts have one line per series and escape their labels', () => {
    const cdf = cdfChartSvg('a <b> & "c"', [
      { label: 'x', samplesMs: [1, 2, 3] },
      { label: 'y', samplesMs: [10, 20] },
    ]);
    expect(cdf.match(/<polyline/g)).toHaveLength(2);
    expect(cdf).toContain('a &lt;b&gt; &amp; &quot;c&quot;');
    expect(cdf).not.toMatch(/NaN|Infinity/);
    const lines = lineChartsSvg('t', 'x', [{ title: 'p', yLabel: 'y', series: [{ label: 's', points: [{ x: 1, y: 0 }, { x: 2, y: 3 }] }] }]);
    expect(lines.match(/<circle/g)).toHaveLength(2);
    expect(lines.trim().endsWith('</svg>')).toBe(true);
  });

  it('draws a CDF of 200,000 samples (more than a spread call takes) from at most 2,000 points, labelled with the true count', () => {
    const samplesMs = Array.from({ length: 200_000 }, (_, i) => 1 + (i % 1000));
    const cdf = cdfChartSvg('many', [{ label: 'creates', samplesMs }]);
    expect(cdf).toContain('creates (n=200000)');
    expect(cdf).not.toMatch(/NaN|Infinity/);
    const points = /<polyline[^>]* points="([^"]*)"/.exec(cdf)![1]!.trim().split(/\s+/);
    expect(points).toHaveLength(2000);
  });
});
