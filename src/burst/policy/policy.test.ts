import { describe, expect, it } from 'vitest';
import { BurstPolicy } from '../../api/index.ts';
import {
  INITIAL_DIVERSION_STATE,
  decideCreate,
  mulberry32,
  planCloudScaling,
  rngStream,
  stepDiversion,
  utilizationOf,
  type CloudHostView,
  type DiversionState,
  type NodeUsage,
} from './index.ts';

const policy = BurstPolicy.parse({});

function node(cpuUsed: number, memoryUsed: number, measured = { cpuFraction: 0, memoryFraction: 0 }): NodeUsage {
  return { capacity: { cpuMillis: 4000, memoryMiB: 8192 }, requested: { cpuMillis: cpuUsed, memoryMiB: memoryUsed }, measured };
}

describe('BurstPolicy schema', () => {
  it('fills defaults and rejects a stop threshold above the start threshold', () => {
    expect(policy).toMatchObject({ divertAboveUtilization: 0.8, stopBelowUtilization: 0.7, dwellMs: 60_000, divertShare: 1, utilizationBasis: 'requested' });
    expect(BurstPolicy.safeParse({ divertAboveUtilization: 0.6, stopBelowUtilization: 0.7 }).success).toBe(false);
    expect(BurstPolicy.safeParse({ divertShare: 1.5 }).success).toBe(false);
    expect(BurstPolicy.safeParse({ nonsense: 1 }).success).toBe(false);
  });
});

describe('mulberry32 / rngStream', () => {
  it('is deterministic per seed, uniform-ish in [0, 1), and streams differ by concern', () => {
    const a = mulberry32(7);
    const b = mulberry32(7);
    const draws = Array.from({ length: 10_000 }, () => a());
    expect(draws.slice(0, 5)).toEqual(Array.from({ length: 5 }, () => b()));
    expect(Math.min(...draws)).toBeGreaterThanOrEqual(0);
    expect(Math.max(...draws)).toBeLessThan(1);
    expect(draws.reduce((s, x) => s + x, 0) / draws.length).toBeCloseTo(0.5, 1);
    expect(rngStream(7, 'placement')()).not.toBe(rngStream(7, 'share')());
    expect(rngStream(7, 'placement')()).toBe(rngStream(7, 'placement')());
  });
});

describe('utilizationOf', () => {
  it('is the more constrained of pooled CPU and memory, on the chosen basis', () => {
    expect(utilizationOf([node(2000, 1024), node(0, 1024)], 'requested')).toBeCloseTo(0.25);
    expect(utilizationOf([node(0, 8192), node(0, 0)], 'requested')).toBeCloseTo(0.5);
    expect(utilizationOf([node(4000, 8192, { cpuFraction: 0.1, memoryFraction: 0.3 })], 'measured')).toBeCloseTo(0.3);
    expect(utilizationOf([], 'requested')).toBe(1);
  });

  it('property: stays in [0, 1] and never falls when a node uses more', () => {
    const random = mulberry32(1);
    for (let trial = 0; trial < 500; trial++) {
      const nodes = Array.from({ length: 1 + Math.floor(random() * 6) }, () => node(random() * 4000, random() * 8192, { cpuFraction: random(), memoryFraction: random() }));
      for (const basis of ['requested', 'measured'] as const) {
        const before = utilizationOf(nodes, basis);
        expect(before).toBeGreaterThanOrEqual(0);
        expect(before).toBeLessThanOrEqual(1);
        const busier = nodes.map((n, i) => (i === 0 ? node(n.requested.cpuMillis + 100, n.requested.memoryMiB + 100, { cpuFraction: Math.min(1, n.measured.cpuFraction + 0.1), memoryFraction: Math.min(1, n.measured.memoryFraction + 0.1) }) : n));
        expect(utilizationOf(busier, basis)).toBeGreaterThanOrEqual(before);
      }
    }
  });
});

describe('stepDiversion', () => {
  it('starts above divertAbove, keeps diverting in the gap, stops after the dwell below stopBelow', () => {
    let s = stepDiversion(INITIAL_DIVERSION_STATE, 0.8, 0, policy);
    expect(s.diverting).toBe(false); // strictly above
    s = stepDiversion(s, 0.85, 1000, policy);
    expect(s).toEqual({ diverting: true, divertingSinceMs: 1000, belowStopSinceMs: null });
    s = stepDiversion(s, 0.75, 2000, policy); // in the gap: still diverting, no dwell
    expect(s).toMatchObject({ diverting: true, belowStopSinceMs: null });
    s = stepDiversion(s, 0.5, 3000, policy);
    expect(s).toMatchObject({ diverting: true, belowStopSinceMs: 3000 });
    s = stepDiversion(s, 0.72, 30_000, policy); // back above stopBelow: dwell resets
    expect(s).toMatchObject({ diverting: true, belowStopSinceMs: null });
    s = stepDiversion(s, 0.6, 40_000, policy);
    s = stepDiversion(s, 0.6, 99_999, policy);
    expect(s.diverting).toBe(true);
    s = stepDiversion(s, 0.6, 100_000, policy);
    expect(s).toEqual(INITIAL_DIVERSION_STATE);
  });

  it('with stopCountsCloudLoad, the cloud sandboxes keep it diverting until local plus cloud load is below stopBelow', () => {
    const diverting: DiversionState = { diverting: true, divertingSinceMs: 0, belowStopSinceMs: null };
    const nodes = [node(1000, 2048)]; // 25% local
    const withCloud = utilizationOf(nodes, 'requested', { cpuMillis: 2000, memoryMiB: 0 }); // 75% if the cloud's sandboxes came home
    expect(withCloud).toBeCloseTo(0.75);
    const local = utilizationOf(nodes, 'requested');
    expect(stepDiversion(diverting, local, 0, { ...policy, dwellMs: 0 }, withCloud).diverting).toBe(true);
    expect(stepDiversion(diverting, local, 0, { ...policy, dwellMs: 0, stopCountsCloudLoad: false }, withCloud).diverting).toBe(false);
    expect(stepDiversion(diverting, local, 0, { ...policy, dwellMs: 0 }).diverting).toBe(false); // caller without cloud load: local alone
  });

  it('property: with divertAbove 1.0 it never diverts; every start and stop is justified', () => {
    const random = mulberry32(2);
    const never = BurstPolicy.parse({ divertAboveUtilization: 1, stopBelowUtilization: 0.9 });
    for (let trial = 0; trial < 100; trial++) {
      const divertAboveUtilization = 0.5 + random() * 0.5;
      const p = BurstPolicy.parse({ divertAboveUtilization, stopBelowUtilization: divertAboveUtilization * random(), dwellMs: Math.floor(random() * 20_000) });
      let s: DiversionState = INITIAL_DIVERSION_STATE;
      let off: DiversionState = INITIAL_DIVERSION_STATE;
      let nowMs = 0;
      const history: { nowMs: number; utilization: number }[] = [];
      for (let step = 0; step < 100; step++) {
        nowMs += Math.floor(random() * 3000);
        const utilization = random();
        history.push({ nowMs, utilization });
        const next = stepDiversion(s, utilization, nowMs, p);
        if (!s.diverting && next.diverting) expect(utilization).toBeGreaterThan(p.divertAboveUtilization);
        if (s.diverting && !next.diverting) {
          // Every observation since the dwell began was below stopBelow, for at least dwellMs.
          const since = s.belowStopSinceMs ?? nowMs;
          expect(nowMs - since).toBeGreaterThanOrEqual(p.dwellMs);
          for (const h of history.filter((h) => h.nowMs >= since)) expect(h.utilization).toBeLessThan(p.stopBelowUtilization);
        }
        if (s.diverting && utilization >= p.stopBelowUtilization) expect(next.diverting).toBe(true);
        s = next;
        off = stepDiversion(off, utilization, nowMs, never);
        expect(off.diverting).toBe(false);
      }
    }
  });
});

describe('decideCreate', () => {
  const diverting: DiversionState = { diverting: true, divertingSinceMs: 0, belowStopSinceMs: null };
  const synced = new Set(['busybox', 'python']);

  it('names the reason for every outcome', () => {
    expect(decideCreate(INITIAL_DIVERSION_STATE, { layers: ['busybox'] }, synced, 0, policy)).toEqual({ target: 'local', reason: 'not_diverting' });
    expect(decideCreate(diverting, { layers: ['busybox'], stayLocal: true }, synced, 0, policy)).toEqual({ target: 'local', reason: 'stay_local' });
    expect(decideCreate(diverting, { layers: ['busybox', 'rust'] }, synced, 0, policy)).toEqual({ target: 'local', reason: 'layers_not_synced' });
    expect(decideCreate(diverting, { layers: ['busybox', 'python'] }, synced, 0.99, policy)).toEqual({ target: 'cloud', reason: 'diverted' });
    const half = BurstPolicy.parse({ divertShare: 0.5 });
    expect(decideCreate(diverting, { layers: ['python'] }, synced, 0.5, half)).toEqual({ target: 'local', reason: 'share' });
    expect(decideCreate(diverting, { layers: ['python'] }, synced, 0.49, half)).toEqual({ target: 'cloud', reason: 'diverted' });
  });

  it('property: cloud only when diverting and eligible; the diverted share tracks divertShare', () => {
    const random = mulberry32(3);
    const layers = ['busybox', 'python', 'rust', 'node'];
    const p = BurstPolicy.parse({ divertShare: 0.3 });
    let eligible = 0;
    let cloud = 0;
    for (let i = 0; i < 20_000; i++) {
      const request = { layers: layers.filter(() => random() < 0.5), stayLocal: random() < 0.1 };
      const state = random() < 0.5 ? diverting : INITIAL_DIVERSION_STATE;
      const decision = decideCreate(state, request, synced, random(), p);
      const isEligible = state.diverting && !request.stayLocal && request.layers.every((l) => synced.has(l));
      if (decision.target === 'cloud') expect(isEligible).toBe(true);
      if (isEligible) {
        eligible++;
        if (decision.target === 'cloud') cloud++;
      }
    }
    expect(cloud / eligible).toBeGreaterThan(0.27);
    expect(cloud / eligible).toBeLessThan(0.33);
  });
});

describe('planCloudScaling', () => {
  const ready = (id: string, sandboxes: number, idleSinceMs: number | null = null): CloudHostView => ({ id, state: 'ready', sandboxes, idleSinceMs });

  it('provisions for the shortfall within cap and rate, and terminates long-idle hosts', () => {
    const p = BurstPolicy.parse({ cloudHostSandboxes: 8, maxCloudHosts: 4, maxProvisionsPerMinute: 2, idleTerminateMs: 300_000 });
    expect(planCloudScaling({ cloudHosts: [], pendingDivertedDemand: 9, provisionsInLastMinute: 0, nowMs: 0 }, p)).toEqual({ provision: 2, terminate: [] });
    expect(planCloudScaling({ cloudHosts: [], pendingDivertedDemand: 100, provisionsInLastMinute: 1, nowMs: 0 }, p)).toEqual({ provision: 1, terminate: [] });
    expect(planCloudScaling({ cloudHosts: [ready('a', 8), ready('b', 8), ready('c', 8)], pendingDivertedDemand: 100, provisionsInLastMinute: 0, nowMs: 0 }, p)).toEqual({ provision: 1, terminate: [] });
    expect(planCloudScaling({ cloudHosts: [{ id: 'a', state: 'provisioning', sandboxes: 0, idleSinceMs: null }], pendingDivertedDemand: 8, provisionsInLastMinute: 1, nowMs: 0 }, p)).toEqual({ provision: 0, terminate: [] });
    const idle = [ready('old', 0, 0), ready('young', 0, 200_000), ready('busy', 3)];
    expect(planCloudScaling({ cloudHosts: idle, pendingDivertedDemand: 0, provisionsInLastMinute: 0, nowMs: 400_000 }, p)).toEqual({ provision: 0, terminate: ['old'] });
    // Demand waiting that the idle host could take: keep it.
    expect(planCloudScaling({ cloudHosts: idle, pendingDivertedDemand: 14, provisionsInLastMinute: 0, nowMs: 400_000 }, p)).toEqual({ provision: 0, terminate: [] });
  });

  it('property: within cap and rate, covers demand when it may, terminates only idle hosts it can spare', () => {
    const random = mulberry32(4);
    for (let trial = 0; trial < 2000; trial++) {
      const p = BurstPolicy.parse({ cloudHostSandboxes: 1 + Math.floor(random() * 10), maxCloudHosts: Math.floor(random() * 8), maxProvisionsPerMinute: Math.floor(random() * 4), idleTerminateMs: Math.floor(random() * 10_000) });
      const nowMs = 20_000;
      const hosts: CloudHostView[] = Array.from({ length: Math.floor(random() * (p.maxCloudHosts + 1)) }, (_, i) => {
        if (random() < 0.2) return { id: `h${i}`, state: 'provisioning', sandboxes: 0, idleSinceMs: null };
        const sandboxes = random() < 0.5 ? 0 : Math.floor(random() * (p.cloudHostSandboxes + 1));
        return ready(`h${i}`, sandboxes, sandboxes === 0 ? Math.floor(random() * nowMs) : null);
      });
      const input = { cloudHosts: hosts, pendingDivertedDemand: Math.floor(random() * 40), provisionsInLastMinute: Math.floor(random() * 4), nowMs };
      const plan = planCloudScaling(input, p);
      expect(plan.provision).toBeGreaterThanOrEqual(0);
      expect(hosts.length + plan.provision).toBeLessThanOrEqual(Math.max(hosts.length, p.maxCloudHosts));
      expect(input.provisionsInLastMinute + plan.provision).toBeLessThanOrEqual(Math.max(input.provisionsInLastMinute, p.maxProvisionsPerMinute));
      const free = (list: CloudHostView[]) => list.reduce((s, h) => s + Math.max(0, p.cloudHostSandboxes - h.sandboxes), 0);
      const freeAfter = free(hosts) + plan.provision * p.cloudHostSandboxes;
      const capped = hosts.length + plan.provision >= p.maxCloudHosts || input.provisionsInLastMinute + plan.provision >= p.maxProvisionsPerMinute;
      if (!capped) expect(freeAfter).toBeGreaterThanOrEqual(input.pendingDivertedDemand);
      if (plan.provision > 0) expect(free(hosts) + (plan.provision - 1) * p.cloudHostSandboxes).toBeLessThan(input.pendingDivertedDemand);
      for (const id of plan.terminate) {
        const host = hosts.find((h) => h.id === id)!;
        expect(host).toMatchObject({ state: 'ready', sandboxes: 0 });
        expect(nowMs - host.idleSinceMs!).toBeGreaterThanOrEqual(p.idleTerminateMs);
      }
      if (plan.terminate.length > 0) expect(free(hosts.filter((h) => !plan.terminate.includes(h.id)))).toBeGreaterThanOrEqual(input.pendingDivertedDemand);
    }
  });
});
