import { afterEach, describe, expect, it, vi } from 'vitest';
import { Deadlines } from './deadlines.ts';

describe('Deadlines', () => {
  afterEach(() => void vi.useRealTimers());

  it('fires each deadline once, when due, and not after it was cleared or moved', () => {
    vi.useFakeTimers({ now: 0 });
    const due: string[] = [];
    const d = new Deadlines((id) => due.push(id));
    d.set('a', 1000);
    d.set('b', 2000);
    d.set('c', 3000);
    d.clear('b');
    d.set('c', 500); // moved earlier
    vi.advanceTimersByTime(999);
    expect(due).toEqual(['c']);
    vi.advanceTimersByTime(1);
    expect(due).toEqual(['c', 'a']);
    vi.advanceTimersByTime(10_000);
    expect(due).toEqual(['c', 'a']);
    expect(d.size).toBe(0);
  });

  it('keeps no timer for an infinite deadline, and fires a past one at once', () => {
    vi.useFakeTimers({ now: 5000 });
    const due: string[] = [];
    const d = new Deadlines((id) => due.push(id));
    d.set('pool', Infinity);
    expect(d.size).toBe(0);
    d.set('late', 1000);
    vi.advanceTimersByTime(0);
    expect(due).toEqual(['late']);
  });

  it('re-arms a deadline past the longest timer delay instead of firing early', () => {
    vi.useFakeTimers({ now: 0 });
    const due: string[] = [];
    const d = new Deadlines((id) => due.push(id));
    const fortyDaysMs = 40 * 24 * 3600 * 1000;
    d.set('long', fortyDaysMs);
    vi.advanceTimersByTime(2 ** 31);
    expect(due).toEqual([]);
    vi.advanceTimersByTime(fortyDaysMs - 2 ** 31);
    expect(due).toEqual(['long']);
  });
});
