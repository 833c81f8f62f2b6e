import { describe, expect, it } from 'vitest';
import { RollboxError } from '../api/index.ts';
import { entryComponents, symlinkStaysInside } from './index.ts';

describe('entry name rules', () => {
  it('splits names and refuses escapes', () => {
    expect(entryComponents('./a//b/./c/')).toEqual(['a', 'b', 'c']);
    expect(() => entryComponents('../x')).toThrow(RollboxError);
    expect(() => entryComponents('a/../../x')).toThrow(/'\.\.'/);
    expect(() => entryComponents('/etc/x')).toThrow(/absolute/);
    expect(symlinkStaysInside(['a', 'l'], '../b')).toBe(true);
    expect(symlinkStaysInside(['a', 'l'], '../../b')).toBe(false);
    expect(symlinkStaysInside(['l'], '/etc/passwd')).toBe(true);
  });
});
