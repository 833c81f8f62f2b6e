/** Creates waiting in arrival order; entries that started or gave up are skipped lazily. */
export class WaitQueue {
  private items: number[] = [];
  private head = 0;
  constructor(private readonly isWaiting: (id: number) => boolean) {}

  push(id: number): void {
    this.items.push(id);
  }

  /** Calls visit on up to `limit` waiting entries from the front; visit returns false to stop. */
  scan(limit: number, visit: (id: number) => boolean): void {
    while (this.head < this.items.length && !this.isWaiting(this.items[this.head]!)) this.head++;
    if (this.head > 4096 && this.head * 2 > this.items.length) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
    let seen = 0;
    for (let j = this.head; j < this.items.length && seen < limit; j++) {
      const id = this.items[j]!;
      if (!this.isWaiting(id)) continue;
      seen++;
      if (!visit(id)) return;
    }
  }
}
