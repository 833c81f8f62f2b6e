import { describe, expect, it } from 'vitest';
import { mulberry32 } from '../policy/index.ts';
import { EventHeap } from './heap.ts';

describe('EventHeap', () => {
  it('pops in (atMs, seq) order whatever the push order', () => {
    const random = mulberry32(5);
    const heap = new EventHeap<{ atMs: number; seq: number }>();
    const pushed = Array.from({ length: 5000 }, (_, seq) => ({ atMs: Math.floor(random() * 100), seq }));
    for (const e of pushed) heap.push(e);
    const popped = [];
    while (heap.size > 0) popped.push(heap.pop()!);
    expect(popped).toEqual([...pushed].sort((a, b) => a.atMs - b.atMs || a.seq - b.seq));
    expect(heap.pop()).toBeUndefined();
  });
});
