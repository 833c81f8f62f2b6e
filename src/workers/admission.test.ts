import { describe, expect, it } from 'vitest';
import { reservationOf } from '../api/index.ts';
import { withDefaultRequests } from '../gateway/placement-of.ts';
import { decideAdmission, diskCapacityMiB, type AdmissionState } from './admission.ts';
import { LocalSandboxes } from './local-sandboxes.ts';

const base: AdmissionState = {
  capacity: { memoryMiB: 1000, cpuMillis: 4000, maxSandboxes: 3 },
  reserved: { memoryMiB: 0, cpuMillis: 0, diskMiB: 0 },
  sandboxes: 0,
  hostFreeMemoryMiB: 8000,
  hostReserveMiB: 256,
  disk: { capacityMiB: 8000, freeMiB: 2000, sizeMiB: 2000 },
};
const small = { memoryMiB: 1, cpuMillis: 1, diskMiB: 1 };

describe('decideAdmission', () => {
  it('admits within every limit', () => {
    expect(decideAdmission(base, { memoryMiB: 1000, cpuMillis: 4000, diskMiB: 8000 })).toEqual({ admit: true });
  });
  it('refuses past memory, cpu, slots and host pressure, naming the reason', () => {
    expect(decideAdmission({ ...base, reserved: { memoryMiB: 600, cpuMillis: 0, diskMiB: 0 } }, { ...small, memoryMiB: 500 })).toMatchObject({ admit: false, reason: expect.stringContaining('memory') });
    expect(decideAdmission(base, { ...small, cpuMillis: 4001 })).toMatchObject({ admit: false, reason: expect.stringContaining('cpu') });
    expect(decideAdmission({ ...base, sandboxes: 3 }, small)).toMatchObject({ admit: false, reason: expect.stringContaining('sandbox limit') });
    expect(decideAdmission({ ...base, hostFreeMemoryMiB: 100 }, small)).toMatchObject({ admit: false, reason: expect.stringContaining('pressure') });
  });
  it('refuses a disk that does not fit the promised scratch space, counting disks already promised', () => {
    expect(decideAdmission(base, { ...small, diskMiB: 8001 })).toMatchObject({ admit: false, reason: expect.stringContaining('disk: 0 MiB reserved + 8001 MiB') });
    const reserved = { ...base, reserved: { memoryMiB: 0, cpuMillis: 0, diskMiB: 7500 } };
    expect(decideAdmission(reserved, { ...small, diskMiB: 500 })).toEqual({ admit: true });
    expect(decideAdmission(reserved, { ...small, diskMiB: 501 })).toMatchObject({ admit: false, reason: expect.stringContaining('disk:') });
  });
  it('refuses any new disk while the scratch filesystem itself is nearly full, overcommit or not', () => {
    expect(decideAdmission({ ...base, disk: { ...base.disk, freeMiB: 99 } }, small)).toMatchObject({ admit: false, reason: expect.stringContaining('disk pressure') });
    expect(decideAdmission({ ...base, disk: { ...base.disk, freeMiB: 100 } }, small)).toEqual({ admit: true });
  });
});

describe('admission of lazy layers (the chunk cache)', () => {
  const cache = { committedBytes: 600, limitBytes: 1000 };
  it('refuses a sandbox whose lazy layers would not fit the cache next to the mounted ones', () => {
    expect(decideAdmission({ ...base, layerCache: cache }, { ...small, layerCacheBytes: 400 })).toEqual({ admit: true });
    expect(decideAdmission({ ...base, layerCache: cache }, { ...small, layerCacheBytes: 401 })).toMatchObject({ admit: false, reason: expect.stringContaining('layer cache') });
  });
  it('admits what needs nothing of the cache, and hosts without one', () => {
    expect(decideAdmission({ ...base, layerCache: { committedBytes: 5000, limitBytes: 1000 } }, { ...small, layerCacheBytes: 0 })).toEqual({ admit: true });
    expect(decideAdmission(base, { ...small, layerCacheBytes: 1e12 })).toEqual({ admit: true });
  });
});

describe('admission under pressure and by requests', () => {
  it('refuses while the host thrashes on memory, and on cpu only when asked to watch it', () => {
    const pressure = { memoryFullPct: 0, cpuSomePct: 99, memoryFullMaxPct: 10, cpuSomeMaxPct: 0 };
    expect(decideAdmission({ ...base, pressure }, small)).toEqual({ admit: true });
    expect(decideAdmission({ ...base, pressure: { ...pressure, memoryFullPct: 12.5 } }, small)).toMatchObject({ admit: false, reason: expect.stringContaining('memory pressure') });
    expect(decideAdmission({ ...base, pressure: { ...pressure, memoryFullPct: 12.5, memoryFullMaxPct: 0 } }, small)).toEqual({ admit: true });
    expect(decideAdmission({ ...base, pressure: { ...pressure, cpuSomeMaxPct: 90 } }, small)).toMatchObject({ admit: false, reason: expect.stringContaining('cpu pressure') });
  });

  it('counts what sandboxes reserve (their requests), not their limits, so idle ones share a host', () => {
    const limits = { cpuMillis: 1000, memoryMiB: 512, diskMiB: 64 };
    expect(reservationOf(limits)).toEqual(limits);
    const reserved = reservationOf({ ...limits, requests: { memoryMiB: 16, cpuMillis: 10 } });
    expect(reserved).toEqual({ cpuMillis: 10, memoryMiB: 16, diskMiB: 64 });
    // 1000 MiB of capacity: one sandbox by its 512 MiB limit would leave room for one more; by its request, for 62.
    expect(decideAdmission({ ...base, capacity: { ...base.capacity, maxSandboxes: 1000 }, reserved: { memoryMiB: 61 * 16, cpuMillis: 610, diskMiB: 0 } }, reserved)).toEqual({ admit: true });
    expect(withDefaultRequests({ cpuMillis: 1000, memoryMiB: 512 }, { memoryMiB: 64, cpuMillis: 100 }).requests).toEqual({ memoryMiB: 64, cpuMillis: 100 });
    // Never above the limit; what the create gave stays.
    expect(withDefaultRequests({ cpuMillis: 50, memoryMiB: 32, requests: { memoryMiB: 8 } }, { memoryMiB: 64, cpuMillis: 100 }).requests).toEqual({ memoryMiB: 8, cpuMillis: 50 });
  });
});

describe('diskCapacityMiB', () => {
  it('overcommits sparse disks and never preallocated ones', () => {
    expect(diskCapacityMiB({ sizeMiB: 1000, preallocated: false }, 8)).toBe(8000);
    expect(diskCapacityMiB({ sizeMiB: 1000, preallocated: true }, 8)).toBe(1000);
  });
});

describe('a sandbox paged out to swap in admission', () => {
  it('counts what it still holds, not its request, until it resumes', () => {
    const local = new LocalSandboxes();
    const base = { cpuMillis: 100, diskMiB: 10, expiresAtMs: Infinity, starting: false };
    local.set({ id: 'a', memoryMiB: 320, ...base });
    local.set({ id: 'b', memoryMiB: 64, ...base });
    expect(local.reserved().memoryMiB).toBe(384);
    local.get('a')!.residentMiB = 2;
    expect(local.reserved()).toEqual({ memoryMiB: 66, cpuMillis: 200, diskMiB: 20 });
    // Never more than it reserved, however much it holds.
    local.get('b')!.residentMiB = 100;
    expect(local.reserved().memoryMiB).toBe(66);
    delete local.get('a')!.residentMiB;
    expect(local.reserved().memoryMiB).toBe(384);
  });
});
