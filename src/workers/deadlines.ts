/** setTimeout's longest delay (about 24.8 days); a later deadline is re-armed on the way. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * One timer per sandbox with a deadline (its TTL): nothing runs until one is due, so an
 * idle host spends no CPU on expiries however many sandboxes it holds (a sweep of every
 * sandbox each second cost ~0.1 ms per 1,000 sandboxes per tick, and grew with them).
 */
export class Deadlines {
  private readonly timers = new Map<string, NodeJS.Timeout>();

  constructor(
    private readonly onDue: (id: string) => void,
    private readonly now: () => number = Date.now,
  ) {}

  get size(): number {
    return this.timers.size;
  }

  /** Sets (or moves) `id`'s deadline; Infinity or NaN clears it. */
  set(id: string, atMs: number): void {
    this.clear(id);
    if (!Number.isFinite(atMs)) return;
    const delayMs = Math.max(0, atMs - this.now());
    const timer = setTimeout(() => {
      this.timers.delete(id);
      if (delayMs > MAX_TIMER_MS) this.set(id, atMs);
      else this.onDue(id);
    }, Math.min(delayMs, MAX_TIMER_MS));
    timer.unref();
    this.timers.set(id, timer);
  }

  clear(id: string): void {
    clearTimeout(this.timers.get(id));
    this.timers.delete(id);
  }

  clearAll(): void {
    for (const timer of this.timers.values()) clearTimeout(timer);
    this.timers.clear();
  }
}
