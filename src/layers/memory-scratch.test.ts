import { existsSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { RollboxError } from '../api/index.ts';
import { MemoryScratch, outgrewReservation } from './memory-scratch.ts';

describe('MemoryScratch', () => {
  it('hands out reservations within its budget and takes them back once', () => {
    const scratch = MemoryScratch.at('/dev/shm', 10 << 20, `test-${process.pid}`)!;
    expect(scratch).toBeDefined();
    const a = scratch.reserve(6 << 20)!;
    expect(a).toMatchObject({ dir: expect.stringMatching(/^\/dev\/shm\/rollbox-pulls-[0-9a-f]{12}$/), bytes: 6 << 20 });
    expect(scratch.reserve(6 << 20)).toBeUndefined();
    a.release();
    a.release();
    expect(scratch.heldBytes).toBe(0);
    expect(scratch.reserve(10 << 20)).toBeDefined();
    // Another start for the same owner empties the directory (what a killed gateway left).
    writeFileSync(path.join(a.dir, 'left-over'), 'x');
    const again = MemoryScratch.at('/dev/shm', 10 << 20, `test-${process.pid}`)!;
    expect(readdirSync(a.dir)).toEqual([]);
    again.remove();
    expect(existsSync(a.dir)).toBe(false);
  });

  it('is none on a directory that is not a tmpfs, or with a budget of 0', () => {
    expect(MemoryScratch.at(process.cwd(), 10 << 20, 'x')).toBeUndefined();
    expect(MemoryScratch.at('/dev/shm', 0, 'x')).toBeUndefined();
    expect(MemoryScratch.at('/no/such/dir', 10 << 20, 'x')).toBeUndefined();
  });

  it('tells a tree that outgrew its reservation from a layer past its own cap', () => {
    const past = (n: number) => new RollboxError('payload_too_large', `layer contents exceed ${n} bytes`);
    expect(outgrewReservation(past(100), 100, 1000)).toBe(true);
    expect(outgrewReservation(past(1000), 1000, 1000)).toBe(false);
    expect(outgrewReservation(new RollboxError('payload_too_large', 'layer has more than 5 entries'), 100, 1000)).toBe(false);
    expect(outgrewReservation(new Error('ENOSPC: no space left on device, write'), 100, 1000)).toBe(true);
    expect(outgrewReservation(new RollboxError('invalid_layer', 'bad'), 100, 1000)).toBe(false);
  });
});
