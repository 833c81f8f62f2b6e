import { describe, expect, it } from 'vitest';
import { decideAdmission, diskCapacityMiB, type AdmissionState } from './admission.ts';

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

describe('diskCapacityMiB', () => {
  it('overcommits sparse disks and never preallocated ones', () => {
    expect(diskCapacityMiB({ sizeMiB: 1000, preallocated: false }, 8)).toBe(8000);
    expect(diskCapacityMiB({ sizeMiB: 1000, preallocated: true }, 8)).toBe(1000);
  });
});
