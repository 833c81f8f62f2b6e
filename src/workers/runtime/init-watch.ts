import net from 'node:net';

/**
 * Learns of an init's death by an event instead of polling /proc: one idle connection to
 * each sandbox's init channel. The init only ever holds such a connection (it sends no
 * SPAWN on it, so it carries no command); when the init dies, the kernel closes its end and
 * this side sees the close at once. A watched host costs one file descriptor per sandbox
 * and no CPU while nothing happens (measured in bench:density).
 *
 * A close is only a hint: `confirmDead` decides (the init may also have refused the
 * connection because it was at its session limit). A live init is watched again after
 * `rewatchDelayMs`, so a refusing init cannot make this spin.
 */
export class InitWatch {
  private readonly watched = new Map<string, net.Socket>();
  private readonly rewatch = new Map<string, NodeJS.Timeout>();
  /** Closed, being confirmed: `unwatch` meanwhile withdraws the report. */
  private readonly checking = new Set<string>();

  constructor(
    private readonly deps: {
      /** Whether the sandbox's init is really gone (runc state + /proc). */
      confirmDead: (sandboxId: string) => Promise<boolean>;
      /** Called once per death of a watched init that `unwatch` did not announce. */
      onDeath: (sandboxId: string) => void;
      rewatchDelayMs?: number;
      onError?: (sandboxId: string, err: unknown) => void;
    },
  ) {}

  get size(): number {
    return this.watched.size;
  }

  /** Starts watching (again): the previous connection of this id, if any, is dropped first. */
  watch(sandboxId: string, socketPath: string): void {
    this.unwatch(sandboxId);
    const socket = net.createConnection(socketPath);
    // Nothing is ever read or written: an error only precedes the close.
    socket.on('error', () => undefined);
    socket.on('data', () => undefined);
    socket.once('close', () => {
      if (this.watched.get(sandboxId) !== socket) return; // unwatched or replaced
      this.watched.delete(sandboxId);
      this.checking.add(sandboxId);
      void this.check(sandboxId, socketPath);
    });
    socket.unref();
    this.watched.set(sandboxId, socket);
  }

  /** Stops watching: a death from now on (a destroy's own kill) is not reported. */
  unwatch(sandboxId: string): void {
    const socket = this.watched.get(sandboxId);
    this.watched.delete(sandboxId);
    socket?.destroy();
    this.checking.delete(sandboxId);
    clearTimeout(this.rewatch.get(sandboxId));
    this.rewatch.delete(sandboxId);
  }

  /** Ends every watch (the runtime's process stops; the inits live on). */
  close(): void {
    for (const id of [...this.watched.keys(), ...this.rewatch.keys(), ...this.checking]) this.unwatch(id);
  }

  private async check(sandboxId: string, socketPath: string): Promise<void> {
    let dead: boolean;
    try {
      dead = await this.deps.confirmDead(sandboxId);
    } catch (err) {
      this.deps.onError?.(sandboxId, err);
      dead = false;
    }
    // Unwatched (a destroy began) or watched anew while we looked: not ours to report.
    if (!this.checking.delete(sandboxId)) return;
    if (dead) return this.deps.onDeath(sandboxId);
    const timer = setTimeout(() => {
      this.rewatch.delete(sandboxId);
      this.watch(sandboxId, socketPath);
    }, this.deps.rewatchDelayMs ?? 1000);
    timer.unref();
    this.rewatch.set(sandboxId, timer);
  }
}
