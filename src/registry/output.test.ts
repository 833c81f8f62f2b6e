import { describe, expect, it } from 'vitest';
import { incompleteUtf8Tail } from './output.ts';

describe('incompleteUtf8Tail', () => {
  it('finds the start of a character cut at the end of a chunk, and nothing in whole text', () => {
    const text = Buffer.from('a€😀é', 'utf8'); // 1 + 3 + 4 + 2 bytes
    const cuts: number[] = [];
    for (let end = 0; end <= text.length; end++) cuts.push(incompleteUtf8Tail(text.subarray(0, end)));
    expect(cuts).toEqual([0, 0, 1, 2, 0, 1, 2, 3, 0, 1, 0]);
    // Bytes that are no UTF-8 at all are passed on, not held back.
    expect(incompleteUtf8Tail(Buffer.from([0x80, 0x80, 0x80, 0x80]))).toBe(0);
  });
});
