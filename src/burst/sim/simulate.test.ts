import { describe, expect, it } from 'vitest';
import { BurstPolicy, type TraceEvent } from '../../api/index.ts';
import { DEFAULT_TRACE_OPTIONS, generateTrace } from '../trace/index.ts';
import { SimModel, capStepRises, runSweep, simulate, sweepCsv, sweepSvg } from './index.ts';

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
    expect(r.overflowAbsorbedByCloud).toBe(r.startedCloud);
    // Overflow: to the cloud, or queued (then it waited, or gave up).
    expect(r.overflow).toBeGreaterThanOrEqual(Math.max(r.startedCloud, r.refused));
    expect(r.overflow).toBeLessThanOrEqual(r.startedCloud + r.waited);
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

  it('on the test traces more cloud capacity never raised queue wait p50 or p99 (not guaranteed in general, see below)', () => {
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

  it('one pool (one request shape, every create diverted, no give-ups): no single create waits longer with more cloud hosts', () => {
    // Local and cloud slots then form one first-come first-served pool of identical slots,
    // and a FIFO multi-server never starts anyone later when it has more servers (the
    // Kiefer-Wolfowitz argument). What this case leaves to the test: that the larger cap has
    // at least as many ready hosts at every moment (scale-up follows backlog).
    for (const rate of [0.45, 0.7, 1.2]) {
      for (let seed = 1; seed <= 3; seed++) {
        const { header, events } = generateTrace({ ...DEFAULT_TRACE_OPTIONS, durationMs: 1_800_000, seed, baseRatePerSecond: rate, burstsPerDay: 150, diurnalAmplitude: 0, shapes: [{ cpuMillis: 2000, memoryMiB: 4096 }], syncedShare: 1, stayLocalShare: 0 });
        const model = SimModel.parse({ localNodes: 4, seed, cloudProvisioningDelayMs: 30_000, cloudLayerSyncDelayMs: 10_000, maxQueueWaitMs: 86_400_000 });
        let previous: { cap: number; waitsMs: Float64Array; r: ReturnType<typeof simulate> } | undefined;
        for (const cap of [0, 1, 2, 4, 8, 16]) {
          const waitsMs = new Float64Array(events.length);
          // Diverting from the first heartbeat with any load on, never stopping.
          const r = simulate(events, BurstPolicy.parse({ divertAboveUtilization: 0, stopBelowUtilization: 0, maxCloudHosts: cap }), model, new Set(header.syncedLayers), { waitsMs });
          if (previous) {
            const where = `rate ${rate} seed ${seed}: cap ${previous.cap} -> ${cap}`;
            const later = waitsMs.findIndex((w, i) => w > previous!.waitsMs[i]!);
            expect(later, `${where}: create ${later} waited longer`).toBe(-1);
            expect(r.queueWaitP99Ms, where).toBeLessThanOrEqual(previous.r.queueWaitP99Ms);
            expect(r.queueWaitMeanMs, where).toBeLessThanOrEqual(previous.r.queueWaitMeanMs);
          }
          previous = { cap, waitsMs, r };
        }
      }
    }
  });

  it('queueing, not a simulator bug: with give-ups, one more cloud host can raise p50', () => {
    // One local slot, a 10 s give-up. With no cloud host, diverted B runs locally and long
    // C gives up, so the five short D creates get the slot after B. With one host, B runs
    // in the cloud, C starts in time and holds the slot, and every D gives up.
    const create = (atMs: number, lifetimeMs: number, stayLocal = true): TraceEvent => ({ atMs, lifetimeMs, cpuMillis: 1000, memoryMiB: 1024, layers: ['base'], stayLocal });
    const events = [create(0, 8000), create(1500, 8000, false), create(1600, 100_000), ...[0, 1, 2, 3, 4].map((k) => create(9000 + 100 * k, 1000))];
    const model = SimModel.parse({ localNodes: 1, nodeCpuMillis: 1000, nodeMemoryMiB: 1024, maxQueueWaitMs: 10_000, cloudProvisioningDelayMs: 0, cloudLayerSyncDelayMs: 0 });
    const run = (cap: number) => simulate(events, BurstPolicy.parse({ divertAboveUtilization: 0.5, stopBelowUtilization: 0, maxCloudHosts: cap, cloudHostSandboxes: 1 }), model, new Set(['base']));
    expect(run(0)).toMatchObject({ startedCloud: 0, refused: 2, queueWaitP50Ms: 7900 });
    expect(run(1)).toMatchObject({ startedCloud: 1, refused: 5, queueWaitP50Ms: 10_000 });
  });

  it('queueing, not a simulator bug: a diverted create that falls back can take a local slot the cloud would have taken', () => {
    // One request shape, no give-ups, some creates not eligible for the cloud. A diverted
    // create waits for a local and a cloud slot at once. With 16 hosts the local pool frees a
    // slot first, so a 181 s sandbox (create 940) runs locally instead of in the cloud (as
    // with 8 hosts), and two local-only creates later start 1.2 s and 1.3 s later.
    const { header, events } = generateTrace({ ...DEFAULT_TRACE_OPTIONS, durationMs: 1_800_000, seed: 26, baseRatePerSecond: 1.2, burstsPerDay: 150, diurnalAmplitude: 0, shapes: [{ cpuMillis: 2000, memoryMiB: 4096 }] });
    const model = SimModel.parse({ localNodes: 4, seed: 26, cloudProvisioningDelayMs: 30_000, cloudLayerSyncDelayMs: 10_000, maxQueueWaitMs: 86_400_000 });
    const waits = (cap: number) => {
      const waitsMs = new Float64Array(events.length);
      simulate(events, BurstPolicy.parse({ divertAboveUtilization: 0, stopBelowUtilization: 0, maxCloudHosts: cap, idleTerminateMs: 86_400_000, maxProvisionsPerMinute: 100 }), model, new Set(header.syncedLayers), { waitsMs });
      return waitsMs;
    };
    const synced = new Set(header.syncedLayers);
    const [with8, with16] = [waits(8), waits(16)];
    const longer = [...with16.keys()].filter((i) => with16[i]! > with8[i]!);
    expect(longer.map((i) => events[i]!.stayLocal || !events[i]!.layers.every((l) => synced.has(l)))).toEqual([true, true]);
    expect(Math.max(...longer.map((i) => with16[i]! - with8[i]!))).toBeGreaterThan(1000);
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
    expect(csv[0]).toMatch(/,waitRoseVsSmallerCap$/);
    const svg = sweepSvg(rows, 0.1, 'test');
    expect(svg.match(/<polyline/g)).toHaveLength(6); // three panels, two caps each
    expect(svg).toContain('max 4 cloud hosts');
  });

  it('capStepRises names every cap step where a wait statistic rose, and the CSV marks it', () => {
    const result = (p50: number, p99: number, refused = 0) => ({ queueWaitP50Ms: p50, queueWaitP99Ms: p99, queueWaitMeanMs: p50, refused }) as ReturnType<typeof simulate>;
    const row = (cap: number, p50: number, p99: number, refused = 0) => ({ divertAboveUtilization: 0.8, stopBelowUtilization: 0.7, gap: 0.1, maxCloudHosts: cap, result: result(p50, p99, refused) });
    const rows = [row(0, 100, 900), row(4, 50, 950, 2), row(16, 50, 100)];
    expect(capStepRises(rows)).toEqual([{ divertAboveUtilization: 0.8, stopBelowUtilization: 0.7, capFrom: 0, capTo: 4, metric: 'queueWaitP99Ms', beforeMs: 900, afterMs: 950, gaveUp: true }]);
    expect(sweepCsv(rows).trim().split('\n').map((line) => line.split(',').at(-1))).toEqual(['waitRoseVsSmallerCap', '', 'p99', '']);
  });
});
