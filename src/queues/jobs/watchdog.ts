/**
 * BullMQ workers are known to stop fetching after a Redis restart: the blocking fetch
 * never returns, jobs pile up in `wait`, and the worker looks healthy. The watchdog asks,
 * every `intervalMs`, whether jobs wait while this worker has started none and runs none;
 * seen twice in a row, it restarts the worker. One LLEN per interval when idle.
 */
export interface WatchedWorker {
  /** Jobs this worker runs now. */
  active(): number;
  /** How many jobs this worker has started since it was made (grows as it fetches). */
  started(): number;
  /** Jobs waiting in the queue. */
  waiting(): Promise<number>;
  /** Closes the worker and opens a new one in its place. */
  restart(): Promise<void>;
}

export class JobWorkerWatchdog {
  private timer: NodeJS.Timeout | undefined;
  private suspectAtStarted: number | undefined;
  private checking = false;

  constructor(
    private readonly worker: WatchedWorker,
    private readonly intervalMs: number,
    private readonly onRestart: (waiting: number) => void,
    private readonly onError: (err: unknown) => void,
  ) {}

  start(): void {
    this.timer = setInterval(() => void this.check(), this.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }

  /** One look (exported for the interval; a test may call it directly). */
  async check(): Promise<void> {
    if (this.checking) return;
    this.checking = true;
    try {
      const started = this.worker.started();
      const waiting = this.worker.active() === 0 ? await this.worker.waiting() : 0;
      if (waiting === 0) {
        this.suspectAtStarted = undefined;
        return;
      }
      if (this.suspectAtStarted === started) {
        this.suspectAtStarted = undefined;
        this.onRestart(waiting);
        await this.worker.restart();
        return;
      }
      this.suspectAtStarted = started;
    } catch (err) {
      this.onError(err);
    } finally {
      this.checking = false;
    }
  }
}
