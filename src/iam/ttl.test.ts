import { describe, expect, it } from 'vitest';
import { RollboxError } from '../api/index.ts';
import { parseTtl } from './index.ts';

describe('parseTtl', () => {
  it.each([
    ['45s', 45],
    ['30m', 1800],
    ['1h', 3600],
    ['2d', 172_800],
    ['3600', 3600],
    [' 1h ', 3600],
  ])('%s → %d seconds', (input, seconds) => {
    expect(parseTtl(input)).toBe(seconds);
  });

  it.each(['', 'abc', '1x', '1.5h', '-5', '0', '0s', 'h', '1h30m', '1 h', '99999999999d'])('rejects %j', (input) => {
    const attempt = () => parseTtl(input);
    expect(attempt).toThrow(RollboxError);
    expect(attempt).toThrow(/invalid TTL .*e\.g\. 3600, 30m, 1h, 2d/);
  });
});
