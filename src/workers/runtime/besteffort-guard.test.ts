import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { BesteffortGuard, MIN_HELD_QUOTA_US } from './besteffort-guard.ts';

// Plain files stand in for cpu.cfs_quota_us here; runtime.test.ts checks the real cgroups.
let dir: string;
afterEach(() => rmSync(dir, { recursive: true, force: true }));

function quotaFiles(values: Record<string, string>): { files: string[]; read: () => Record<string, string> } {
  dir = mkdtempSync(path.join(os.tmpdir(), 'rollbox-guard-'));
  const files = Object.entries(values).map(([name, value]) => {
    const file = path.join(dir, name);
    writeFileSync(file, `${value}\n`);
    return file;
  });
  return { files, read: () => Object.fromEntries(files.map((f) => [path.basename(f), readFileSync(f, 'utf8').trim()])) };
}

describe('BesteffortGuard', () => {
  it('caps while any holder holds and gives back each sandbox its own quota after the last', () => {
    const { files, read } = quotaFiles({ a: '50000', b: '-1', c: '500' });
    const guard = new BesteffortGuard({ quotaFiles: () => files, maxHoldMs: 60_000 });
    const first = guard.hold();
    const second = guard.hold();
    const capped = String(MIN_HELD_QUOTA_US);
    // c is already below the cap: left alone.
    expect(read()).toEqual({ a: capped, b: capped, c: '500' });
    first();
    first(); // releasing twice counts once
    expect(guard.engaged).toBe(true);
    expect(read()).toEqual({ a: capped, b: capped, c: '500' });
    second();
    expect(guard.engaged).toBe(false);
    expect(read()).toEqual({ a: '50000', b: '-1', c: '500' });
  });

  it('does nothing with maxHoldMs 0, and a sandbox gone meanwhile is no error', () => {
    const { files, read } = quotaFiles({ a: '50000', b: '25000' });
    new BesteffortGuard({ quotaFiles: () => files, maxHoldMs: 0 }).hold()();
    expect(read()).toEqual({ a: '50000', b: '25000' });
    const errors: string[] = [];
    const guard = new BesteffortGuard({ quotaFiles: () => files, maxHoldMs: 60_000, onError: (file) => errors.push(file) });
    const release = guard.hold();
    rmSync(files[1]!);
    release();
    expect(readFileSync(files[0]!, 'utf8')).toBe('50000');
    expect(errors).toEqual([]);
  });

  it('holds back a sandbox that starts during a hold, and gives it back with the others', () => {
    const { files, read } = quotaFiles({ a: '50000', late: '25000' });
    const guard = new BesteffortGuard({ quotaFiles: () => files.slice(0, 1), maxHoldMs: 60_000 });
    guard.started(files[1]!); // no hold: untouched
    expect(read()).toEqual({ a: '50000', late: '25000' });
    const release = guard.hold();
    guard.started(files[1]!);
    expect(read()).toEqual({ a: String(MIN_HELD_QUOTA_US), late: String(MIN_HELD_QUOTA_US) });
    release();
    expect(read()).toEqual({ a: '50000', late: '25000' });
  });

  it('releases on its own after maxHoldMs', async () => {
    const { files, read } = quotaFiles({ a: '50000' });
    const guard = new BesteffortGuard({ quotaFiles: () => files, maxHoldMs: 50 });
    guard.hold();
    expect(read()).toEqual({ a: String(MIN_HELD_QUOTA_US) });
    await new Promise((r) => setTimeout(r, 200));
    expect(guard.engaged).toBe(false);
    expect(read()).toEqual({ a: '50000' });
  });
});
