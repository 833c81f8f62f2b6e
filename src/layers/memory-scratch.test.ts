import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { RollboxError } from '../api/index.ts';
import { MemoryScratch, outgrewReservation } from './memory-scratch.ts';

describe('MemoryScratch', () => {
  it('hands out reservations within its budget and takes them back once', () => {
    const scratch = MemoryScratch.at('/dev/shm', 10 << 20)!;
    expect(scratch).toBeDefined();
    const a = scratch.reserve(6 << 20)!;
    expect(a).toMatchObject({ dir: expect.stringMatching(/^\/dev\/shm\/rollbox-pulls-\d+-[0-9a-f]{8}$/), bytes: 6 << 20 });
    expect(scratch.reserve(6 << 20)).toBeUndefined();
    a.release();
    a.release();
    expect(scratch.heldBytes).toBe(0);
    expect(scratch.reserve(10 << 20)).toBeDefined();
    // A second one in the same process has a directory of its own; one of a process that is
    // gone is removed by the next start.
    const other = MemoryScratch.at('/dev/shm', 10 << 20)!;
    expect(other.reserve(1)!.dir).not.toBe(a.dir);
    const deadPid = spawnSync('true').pid!;
    const stale = path.join('/dev/shm', `rollbox-pulls-${deadPid}-0badc0de`);
    mkdirSync(path.join(stale, 'tree'), { recursive: true });
    MemoryScratch.at('/dev/shm', 10 << 20)!.remove();
    expect(existsSync(stale)).toBe(false);
    expect(existsSync(a.dir)).toBe(true);
    scratch.remove();
    other.remove();
    expect(existsSync(a.dir)).toBe(false);
    expect(scratch.reserve(1)).toBeUndefined();
  });

  it('is none on a directory that is not a tmpfs, or with a budget of 0', () => {
    expect(MemoryScratch.at(process.cwd(), 10 << 20)).toBeUndefined();
    expect(MemoryScratch.at('/dev/shm', 0)).toBeUndefined();
    expect(MemoryScratch.at('/no/such/dir', 10 << 20)).toBeUndefined();
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
