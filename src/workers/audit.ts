/**
 * The safety net behind a worker host's events (an init's channel closing, a TTL's timer,
 * a delete's message): every sandbox is checked once per `intervalMs`, spread evenly over
 * ticks rather than all at once, and the host's view is compared with the registry's once
 * per interval (or sooner when asked: the node was declared lost, say). An idle host with
 * N sandboxes does N / intervalMs checks per second, not N per tick.
 */
export class Audit {
  private round: string[] = [];
  private next = 0;
  private roundStartedAtMs = -Infinity;
  private compareRequested = false;

  constructor(
    private readonly deps: {
      intervalMs: number;
      /** How often `tick` is called. */
      tickMs: number;
      now: () => number;
      /** The sandboxes to check this round. */
      ids: () => string[];
      check: (id: string) => Promise<void>;
      compareWithRegistry: () => Promise<void>;
    },
  ) {}

  /** At the next tick, compare with the registry whatever the round. */
  requestCompare(): void {
    this.compareRequested = true;
  }

  async tick(): Promise<void> {
    const { deps } = this;
    const now = deps.now();
    if (now - this.roundStartedAtMs >= deps.intervalMs) {
      this.roundStartedAtMs = now;
      this.round = deps.ids();
      this.next = 0;
      this.compareRequested = true;
    }
    if (this.compareRequested) {
      this.compareRequested = false;
      await deps.compareWithRegistry().catch((err: unknown) => {
        this.compareRequested = true;
        throw err;
      });
    }
    const perTick = Math.ceil((this.round.length * deps.tickMs) / deps.intervalMs);
    const slice = this.round.slice(this.next, this.next + perTick);
    this.next += slice.length;
    for (const id of slice) await deps.check(id);
  }
}
