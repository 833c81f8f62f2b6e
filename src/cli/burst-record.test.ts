import { describe, expect, it } from 'vitest';
import { parseSince } from './burst-record.ts';

describe('parseSince', () => {
  const now = Date.parse('2026-11-29T12:00:00Z');
  it('takes a duration back from now, an ISO date, or epoch ms; names a bad value', () => {
    expect(parseSince('30m', now)).toBe(now - 30 * 60_000);
    expect(parseSince('2h', now)).toBe(now - 2 * 3_600_000);
    expect(parseSince('2026-11-29T11:00:00Z', now)).toBe(now - 3_600_000);
    expect(parseSince(String(now - 5), now)).toBe(now - 5);
    expect(() => parseSince('yesterday-ish', now)).toThrow(/--since "yesterday-ish"/);
  });
});
