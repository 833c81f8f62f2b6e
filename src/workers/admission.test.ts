import { describe, expect, it } from 'vitest';
import { decideAdmission, type AdmissionState } from './admission.ts';

const base: AdmissionState = {
  capacity: { memoryMiB: 1000, cpuMillis: 4000, maxSandboxes: 3 },
  reserved: { memoryMiB: 0, cpuMillis: 0 },
  sandboxes: 0,
  hostFreeMemoryMiB: 8000,
  hostReserveMiB: 256,
};

describe('decideAdmission', () => {
  it('admits within every limit', () => {
    expect(decideAdmission(base, { memoryMiB: 1000, cpuMillis: 4000 })).toEqual({ admit: true });
  });
  it('refuses past memory, cpu, slots and host pressure, naming the reason', () => {
    expect(decideAdmission({ ...base, reserved: { memoryMiB: 600, cpuMillis: 0 } }, { memoryMiB: 500, cpuMillis: 1 })).toMatchObject({ admit: false, reason: expect.stringContaining('memory') });
    expect(decideAdmission(base, { memoryMiB: 1, cpuMillis: 4001 })).toMatchObject({ admit: false, reason: expect.stringContaining('cpu') });
    expect(decideAdmission({ ...base, sandboxes: 3 }, { memoryMiB: 1, cpuMillis: 1 })).toMatchObject({ admit: false, reason: expect.stringContaining('sandbox limit') });
    expect(decideAdmission({ ...base, hostFreeMemoryMiB: 100 }, { memoryMiB: 1, cpuMillis: 1 })).toMatchObject({ admit: false, reason: expect.stringContaining('pressure') });
  });
});
