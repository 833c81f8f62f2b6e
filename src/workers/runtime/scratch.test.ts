import { describe, expect, it } from 'vitest';
import { inodesForDisk } from './disk-templates.ts';

describe('inodesForDisk', () => {
  it('gives one inode per 16 KiB, at least 4096, but never more than one per 4 KiB', () => {
    expect(inodesForDisk(1)).toBe(256);
    expect(inodesForDisk(8)).toBe(2048);
    expect(inodesForDisk(16)).toBe(4096);
    expect(inodesForDisk(64)).toBe(4096);
    expect(inodesForDisk(1024)).toBe(65_536);
    expect(inodesForDisk(1_048_576)).toBe(67_108_864);
    for (const mib of [1, 2, 3, 7, 33, 100, 4097]) {
      expect(inodesForDisk(mib)).toBeLessThanOrEqual(mib * 256);
      expect(inodesForDisk(mib)).toBeGreaterThanOrEqual(Math.min(4096, mib * 256));
    }
  });
});
