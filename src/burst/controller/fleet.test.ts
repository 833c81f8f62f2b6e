import { describe, expect, it } from 'vitest';
import { BurstPolicy, type NodeHeartbeat } from '../../api/index.ts';
import { idleHeartbeat, type PlacementCandidate } from '../../queues/index.ts';
import { LIST_EVERY_MS, PROVISION_TIMEOUT_MS, observeLoad, stepFleet } from './fleet.ts';
import type { HostRecord } from './state.ts';

const CAPACITY = { cpuMillis: 8000, memoryMiB: 1000, maxSandboxes: 100, maxStarting: 8 };
const candidate = (nodeId: string, pool: string, over: Partial<NodeHeartbeat> = {}, ageMs = 0): PlacementCandidate => ({
  heartbeat: { ...idleHeartbeat(nodeId, pool, CAPACITY), ...over },
  ageMs,
  assumed: { memoryMiB: 0, cpuMillis: 0, sandboxes: 0 },
});
const host = (over: Partial<HostRecord>): HostRecord => ({ id: 'cloud-1', providerId: 'vm-1', state: 'ready', sandboxes: 0, provisionedAtMs: 0, idleSinceMs: null, terminatingSinceMs: null, ...over });
const step = (hosts: HostRecord[], candidates: PlacementCandidate[], nowMs: number, listed?: string[]) =>
  stepFleet({ previous: { hosts, retired: [] }, candidates, listedProviderIds: listed && new Set(listed), nowMs, lostAfterMs: 5000, drainGraceMs: 1200 });

describe('the cloud fleet, one tick at a time (no I/O, explicit clock)', () => {
  it('makes a provisioning host ready once it heartbeats ready, and gives up on one that never does', () => {
    const provisioning = host({ state: 'provisioning', provisionedAtMs: 1000 });
    expect(step([provisioning], [candidate('cloud-1', 'cloud', { ready: false })], 2000).hosts).toEqual([provisioning]);
    expect(step([provisioning], [candidate('cloud-1', 'cloud', { ready: true })], 3000).hosts).toMatchObject([{ state: 'ready', idleSinceMs: 3000 }]);
    const late = step([provisioning], [], 1000 + PROVISION_TIMEOUT_MS + 1);
    expect(late.hosts).toEqual([]);
    expect(late.retire).toMatchObject([{ host: { id: 'cloud-1' }, why: 'never became ready' }]);
    expect(late.retired).toEqual([{ id: 'cloud-1', atMs: 1000 + PROVISION_TIMEOUT_MS + 1 }]);
    // A provider that stopped listing it (asked after LIST_EVERY_MS) retires it too.
    expect(step([provisioning], [], 1000 + LIST_EVERY_MS + 1, ['vm-9']).retire).toMatchObject([{ why: 'the provider no longer lists it' }]);
  });

  it('tracks idleness, forgets vanished hosts, and retires a drained host only after the grace', () => {
    const ready = host({ idleSinceMs: null });
    expect(step([ready], [candidate('cloud-1', 'cloud', { sandboxes: 2 })], 100).hosts).toMatchObject([{ sandboxes: 2, idleSinceMs: null }]);
    expect(step([ready], [candidate('cloud-1', 'cloud')], 200).hosts).toMatchObject([{ sandboxes: 0, idleSinceMs: 200 }]);
    expect(step([ready], [candidate('cloud-1', 'cloud', {}, 6000)], 300).retire).toMatchObject([{ why: 'vanished' }]);
    const draining = host({ state: 'terminating', terminatingSinceMs: 1000 });
    expect(step([draining], [candidate('cloud-1', 'cloud')], 2000).hosts).toEqual([draining]);
    expect(step([draining], [candidate('cloud-1', 'cloud')], 2200).retire).toMatchObject([{ why: 'idle' }]);
    // A create that raced the drain brings it back.
    expect(step([draining], [candidate('cloud-1', 'cloud', { sandboxes: 1 })], 2200).hosts).toMatchObject([{ state: 'ready', terminatingSinceMs: null }]);
  });

  it('adopts cloud hosts operators started, once ready, and never re-adopts a retired one', () => {
    const found = step([], [candidate('op-1', 'cloud', { sandboxes: 3 }), candidate('op-2', 'cloud', { ready: false }), candidate('local-1', 'local')], 500);
    expect(found.hosts).toEqual([{ id: 'op-1', providerId: null, state: 'ready', sandboxes: 3, provisionedAtMs: 500, idleSinceMs: null, terminatingSinceMs: null }]);
    const again = stepFleet({ previous: { hosts: [], retired: [{ id: 'op-1', atMs: 400 }] }, candidates: [candidate('op-1', 'cloud')], listedProviderIds: undefined, nowMs: 500, lostAfterMs: 5000, drainGraceMs: 1200 });
    expect(again.hosts).toEqual([]);
  });

  it('observes local utilization, and the same with the cloud load counted as if it came home', () => {
    const policy = BurstPolicy.parse({ utilizationBasis: 'requested' });
    const load = observeLoad([candidate('local-1', 'local', { used: { cpuMillis: 0, memoryMiB: 500 } }), candidate('cloud-1', 'cloud', { used: { cpuMillis: 0, memoryMiB: 300 } }), candidate('gone', 'local', {}, 9000)], policy, { localPool: 'local', lostAfterMs: 5000 });
    expect(load.utilization).toBeCloseTo(0.5);
    expect(load.utilizationWithCloudLoad).toBeCloseTo(0.8);
    expect(load.localHosts).toBe(1); // the silent one does not count
  });
});
