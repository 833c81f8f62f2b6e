/**
 * Binary min-heap of simulation events ordered by (atMs, seq): seq is the insertion
 * order, so events at the same instant run in a fixed order and a seed replays exactly.
 */
export interface HeapEvent {
  atMs: number;
  seq: number;
}

export class EventHeap<E extends HeapEvent> {
  private readonly items: E[] = [];

  get size(): number {
    return this.items.length;
  }

  peek(): E | undefined {
    return this.items[0];
  }

  push(event: E): void {
    const items = this.items;
    items.push(event);
    let i = items.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (!before(event, items[parent]!)) break;
      items[i] = items[parent]!;
      i = parent;
    }
    items[i] = event;
  }

  pop(): E | undefined {
    const items = this.items;
    const top = items[0];
    const last = items.pop();
    if (top === undefined || last === undefined || items.length === 0) return top;
    let i = 0;
    const n = items.length;
    for (;;) {
      const left = 2 * i + 1;
      if (left >= n) break;
      const right = left + 1;
      const child = right < n && before(items[right]!, items[left]!) ? right : left;
      if (!before(items[child]!, last)) break;
      items[i] = items[child]!;
      i = child;
    }
    items[i] = last;
    return top;
  }
}

function before(a: HeapEvent, b: HeapEvent): boolean {
  return a.atMs < b.atMs || (a.atMs === b.atMs && a.seq < b.seq);
}
