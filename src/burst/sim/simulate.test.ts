import { describe, expect, it } from 'vitest';
import { BurstPolicy } from '../../api/index.ts';
import { DEFAULT_TRACE_OPTIONS, generateTrace } from '../trace/index.ts';
import { SimModel, runSweep, simulate, sweepCsv, sweepSvg } from './index.ts';

/** Half an hour on four local hosts: small enough to replay in tens of ms, hot enough to overflow. */
function smallTrace(seed: number, baseRatePerSecond: number) {
  const { header, events } = generateTrace({ ...DEFAULT_TRACE_OPTIONS, durationMs: 1_800_000, seed, baseRatePerSecond, burstsPerDay: 150, diurnalAmplitude: 0 });
  return { events, synced: new Set(header.syncedLayers) };
}
const smallModel = (seed: number) => SimModel.parse({ localNodes: 4, seed, cloudProvisioningDelayMs: 30_000, cloudLayerSyncDelayMs: 10_000 });

describe('simulate', () => {
  it('accounts for every create exactly once', () => {
    const { events, synced } = smallTrace(1, 0.7);
    const r = simulate(events, BurstPolicy.parse({}), smallModel(1), synced);
    expect(r.creates).toBe(events.length);
    expect(r.startedLocal + r.startedCloud + r.refused).toBe(r.creates);
    expect(Object.values(r.byReason).reduce((a, b) => a + b, 0)).toBe(r.creates);
    expect(r.diverted).toBe(r.byReason.diverted);
    expect(r.ineligible).toBe(r.byReason.stay_local! + r.byReason.layers_not_synced!);
    expect(r.startedCloud).toBeLessThanOrEqual(r.diverted);
    expect(r.startedCloud).toBeGreaterThan(0);
    expect(r.overflowAbsorbedByCloud).toBeLessThanOrEqual(Math.min(r.overflow, r.startedCloud));
    expect(r.queueWaitP50Ms).toBeLessThanOrEqual(r.queueWaitP99Ms);
    expect(r.peakCloudHosts).toBeLessThanOrEqual(4);
    expect(r.cloudVmHours).toBeGreaterThan(0);
  });

  it('with divertAbove 1.0 nothing is diverted, though the pool overflows', () => {
    const { events, synced } = smallTrace(2, 0.7);
    const r = simulate(events, BurstPolicy.parse({ divertAboveUtilization: 1, stopBelowUtilization: 0.9, maxCloudHosts: 16 }), smallModel(2), synced);
    expect(r.overflow).toBeGreaterThan(0);
    expect(r.peakUtilization).toBe(1);
    expect(r).toMatchObject({ diverted: 0, startedCloud: 0, cloudVmHours: 0, cloudProvisions: 0, divertingTimeShare: 0, ineligible: 0 });
  });

  it('the same seed gives the same result; another seed another placement', () => {
    const { events, synced } = smallTrace(3, 0.7);
    const policy = BurstPolicy.parse({ divertShare: 0.5 });
    const a = simulate(events, policy, smallModel(3), synced);
    expect(simulate(events, policy, smallModel(3), synced)).toEqual(a);
    expect(simulate(events, policy, smallModel(4), synced)).not.toEqual(a);
  });

  it('more cloud capacity never raises queue wait p50 or p99 (several seeds and loads)', () => {
    for (const rate of [0.55, 0.7]) {
      for (let seed = 1; seed <= 4; seed++) {
        const { events, synced } = smallTrace(seed, rate);
        let previous: { cap: number; p50: number; p99: number } | undefined;
        for (const cap of [0, 1, 2, 4, 8]) {
          const r = simulate(events, BurstPolicy.parse({ maxCloudHosts: cap }), smallModel(seed), synced);
          if (previous) {
            const where = `rate ${rate} seed ${seed}: cap ${previous.cap} -> ${cap}`;
            expect(r.queueWaitP50Ms, where).toBeLessThanOrEqual(previous.p50);
            expect(r.queueWaitP99Ms, where).toBeLessThanOrEqual(previous.p99);
          }
          previous = { cap, p50: r.queueWaitP50Ms, p99: r.queueWaitP99Ms };
        }
      }
    }
  });

  it('why stopCountsCloudLoad: judging local load alone, more cloud hosts end diversion mid-burst and p99 rises', () => {
    // Found by the property above before the policy had the knob: 8 hosts absorb the burst,
    // local load falls below stopBelow, diversion stops, and the rest of the burst queues.
    const { events, synced } = smallTrace(2, 0.55);
    const p99 = (cap: number, stopCountsCloudLoad: boolean) => simulate(events, BurstPolicy.parse({ maxCloudHosts: cap, stopCountsCloudLoad }), smallModel(2), synced).queueWaitP99Ms;
    expect(p99(8, false)).toBeGreaterThan(p99(4, false));
    expect(p99(8, true)).toBeLessThanOrEqual(p99(4, true));
  });
});

describe('runSweep', () => {
  it('runs every grid point and writes a CSV row and a chart line per cap', () => {
    const { events, synced } = smallTrace(5, 0.5);
    const rows = runSweep(events.slice(0, 600), synced, BurstPolicy.parse({}), smallModel(5), { thresholds: [0.7, 1], gaps: [0.1], caps: [0, 4] });
    expect(rows.map((r) => [r.divertAboveUtilization, r.stopBelowUtilization, r.maxCloudHosts])).toEqual([
      [0.7, 0.6, 0],
      [1, 0.9, 0],
      [0.7, 0.6, 4],
      [1, 0.9, 4],
    ]);
    const csv = sweepCsv(rows).trim().split('\n');
    expect(csv).toHaveLength(5);
    expect(csv[0]).toMatch(/^divertAboveUtilization,stopBelowUtilization,gap,maxCloudHosts,queueWaitP50Ms,queueWaitP99Ms,/);
    const svg = sweepSvg(rows, 0.1, 'test');
    expect(svg.match(/<polyline/g)).toHaveLength(6); // three panels, two caps each
    expect(svg).toContain('max 4 cloud hosts');
  });
});
