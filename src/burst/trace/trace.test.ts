import { describe, expect, it } from 'vitest';
import { DEFAULT_TRACE_OPTIONS, generateTrace, parseTrace, traceLine } from './index.ts';

describe('generateTrace', () => {
  const options = { ...DEFAULT_TRACE_OPTIONS, durationMs: 600_000, seed: 9 };

  it('is deterministic per seed, ordered, and mixes synced, unsynced and stay-local creates', () => {
    const a = generateTrace(options);
    expect(generateTrace(options)).toEqual(a);
    expect(generateTrace({ ...options, seed: 10 }).events).not.toEqual(a.events);
    const { events, header } = a;
    expect(events.length).toBeGreaterThan(600); // ~1.8/s at the diurnal trough
    expect(events.every((e, i) => i === 0 || events[i - 1]!.atMs <= e.atMs)).toBe(true);
    expect(events.every((e) => e.atMs < options.durationMs && e.lifetimeMs >= 1000)).toBe(true);
    const synced = new Set(header.syncedLayers);
    const allSynced = events.filter((e) => e.layers.every((l) => synced.has(l))).length / events.length;
    expect(allSynced).toBeGreaterThan(0.6);
    expect(allSynced).toBeLessThan(0.8);
    expect(events.some((e) => e.stayLocal)).toBe(true);
  });
});

describe('parseTrace', () => {
  it('round-trips header and events, sorts late events, names the bad line', () => {
    const { header, events } = generateTrace({ ...DEFAULT_TRACE_OPTIONS, durationMs: 60_000, seed: 1 });
    const text = [header, ...events].map(traceLine).join('');
    expect(parseTrace(text)).toEqual({ header, events });
    const shuffled = [events[1], events[0], ...events.slice(2)].map((e) => traceLine(e!)).join('');
    expect(parseTrace(shuffled)).toEqual({ header: undefined, events });
    expect(() => parseTrace(`${traceLine(events[0]!)}{"atMs":1}\n`)).toThrow(/trace line 2: cpuMillis/);
    expect(() => parseTrace('not json\n')).toThrow(/trace line 1: not JSON/);
  });
});
