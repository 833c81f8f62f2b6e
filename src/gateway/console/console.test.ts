import { describe, expect, it } from 'vitest';
import { observationFields, type SignalBucket } from '../../registry/index.ts';
import { capacityOf } from './capacity.ts';
import { figuresOf, mergeBuckets, quantileOf, seriesOf } from './figures.ts';

const fieldsOf = (pairs: Iterable<[string, number]>): Record<string, number> => {
  const fields: Record<string, number> = {};
  for (const [k, v] of pairs) fields[k] = (fields[k] ?? 0) + v;
  return fields;
};
const observed = (histogram: 'wait' | 'exec' | 'res', values: number[]) => fieldsOf(values.flatMap((v) => observationFields(histogram, v)));

describe('signal figures from log-binned counters', () => {
  it('reads quantiles within one bin (26%) and means exactly', () => {
    const values = Array.from({ length: 1000 }, (_, i) => 5 + i * 3); // 5..3002 ms, uniform
    const fields = observed('exec', values);
    const p50 = quantileOf(fields, 'exec', 0.5)!;
    const p99 = quantileOf(fields, 'exec', 0.99)!;
    expect(Math.abs(p50 - 1503) / 1503).toBeLessThan(0.26);
    expect(Math.abs(p99 - 2972) / 2972).toBeLessThan(0.26);
    const f = figuresOf(0, 10, { ...fields, admitted: 25 });
    expect(f.execs).toBe(1000);
    expect(f.createsPerSecond).toBe(2.5);
    expect(f.waitP50Ms).toBeNull();
    // Median and mean part on a long tail: 90 short, 10 very long.
    const tail = observed('res', [...Array(90).fill(1000), ...Array(10).fill(600_000)]);
    const t = figuresOf(0, 10, tail);
    expect(t.residenceMeanMs).toBe(60_900);
    expect(t.residenceMedianMs!).toBeLessThan(1300);
  });

  it('sums counters and keeps maxima over buckets, and steps a series', () => {
    const buckets: SignalBucket[] = [
      { startMs: 0, fields: { admitted: 2, peakLive: 5, 'refused:no_capacity': 1, 'refused:admission_exhausted': 2 } },
      { startMs: 10_000, fields: { admitted: 3, peakLive: 4, 'refused:quota_exceeded': 1 } },
      { startMs: 20_000, fields: { admitted: 1, peakLive: 9, 'refused:network_unavailable': 1 } },
    ];
    expect(mergeBuckets(buckets)).toMatchObject({ admitted: 6, peakLive: 9 });
    const series = seriesOf(buckets, 0, 40_000, 20);
    expect(series.stepSeconds).toBe(20);
    expect(series.points.map((p) => [p.startMs, p.admitted, p.peakLive])).toEqual([[0, 5, 5], [20_000, 1, 9]]);
    expect(series.total.refusals).toEqual({ quota: 1, no_capacity: 3, network: 1 });
  });
});

describe("capacity from Little's law", () => {
  const node = (sandboxes: number, ready = 0) => ({ sandboxes, pools: ready ? { warm: { version: 'v', ready, starting: 0 } } : undefined });
  // 100 s window: 200 creates (2/s), 150 ended with a residence of 10 s each: L = 20.
  const res = observed('res', Array(150).fill(10_000));
  const buckets: SignalBucket[] = [
    { startMs: 0, fields: { admitted: 100, ...res, peakNode: 12 } },
    { startMs: 50_000, fields: { admitted: 100, peakNode: 30, 'refused:no_capacity': 4 } },
  ];

  it('estimates concurrency, nodes needed with headroom, and one node more or fewer, from the observed calm peak', () => {
    const r = capacityOf({ buckets, fromMs: 0, toMs: 100_000, nodes: [node(11, 2), node(10)], safePerNode: {}, headroom: 1.25 });
    expect(r).toMatchObject({ admissionRatePerSecond: 2, meanResidenceSeconds: 10, estimatedConcurrency: 20, liveSandboxes: 19, residentPool: 2, nodes: 2 });
    // The bucket with capacity refusals does not count as safe: its 30 is ignored.
    expect(r.safePerNode).toEqual({ sandboxes: 12, source: 'observed_peak', observedPeakWithoutRefusals: 12 });
    // (20 + 2) x 1.25 / 12 = 2.29 -> 3 nodes.
    expect(r.nodesNeeded).toBe(3);
    expect(r.scenarios.map((s) => [s.nodes, s.utilization, s.meetsHeadroom])).toEqual([[1, 1.833, false], [2, 0.917, false], [3, 0.611, true]]);
    expect(r.refusals.no_capacity).toBe(4);
    expect(r.explanation).toContain('Admission rate 2/s');
    expect(r.explanation).toContain('mean residence 10 s');
  });

  it('prefers the query over the operator over the observed peak, and says when it cannot estimate', () => {
    expect(capacityOf({ buckets, fromMs: 0, toMs: 100_000, nodes: [node(1)], safePerNode: { fromOperator: 44 }, headroom: 1 }).safePerNode).toMatchObject({ sandboxes: 44, source: 'operator' });
    expect(capacityOf({ buckets, fromMs: 0, toMs: 100_000, nodes: [node(1)], safePerNode: { fromQuery: 5, fromOperator: 44 }, headroom: 1 }).nodesNeeded).toBe(4);
    const none = capacityOf({ buckets: [{ startMs: 0, fields: { admitted: 3 } }], fromMs: 0, toMs: 100_000, nodes: [], safePerNode: {}, headroom: 1.25 });
    expect(none).toMatchObject({ estimatedConcurrency: null, nodesNeeded: null, safePerNode: { source: 'none' } });
    expect(none.explanation).toMatch(/no sandbox ended/);
  });
});
