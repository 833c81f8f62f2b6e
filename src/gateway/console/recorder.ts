import type { Logger } from 'pino';
import type { NodeHeartbeat } from '../../api/index.ts';
import { SignalStore, bucketStartSecOf, observationFields, type SignalHistogram } from '../../registry/index.ts';
import { residentPoolOf } from './capacity.ts';

export interface SignalRecorderDeps {
  store: SignalStore;
  /** The local pool's heartbeats, for the per-bucket peaks. */
  nodes: () => readonly Pick<NodeHeartbeat, 'sandboxes' | 'pools' | 'healthy' | 'pool'>[];
  localPool: string;
  flushMs: number;
  logger: Logger;
  now: () => number;
}

/**
 * What this gateway saw (creates admitted and refused, waits, exec times, batch tasks),
 * added up in memory and written to the shared signals once per `flushMs` as one
 * pipeline: a busy gateway costs Redis one round trip a second, an idle one nothing.
 * Each tick also raises the bucket's peaks (live sandboxes in the cluster, on one node)
 * when they grew, so a steady cluster writes them once per bucket.
 */
export class SignalRecorder {
  private pending = new Map<number, Map<string, number>>();
  private peaks = { bucketSec: -1, live: 0, node: 0 };
  private timer: NodeJS.Timeout | undefined;
  private flushing: Promise<void> = Promise.resolve();

  constructor(private readonly deps: SignalRecorderDeps) {}

  count(field: string, by = 1): void {
    const bucketSec = bucketStartSecOf(this.deps.now());
    let fields = this.pending.get(bucketSec);
    if (!fields) this.pending.set(bucketSec, (fields = new Map()));
    fields.set(field, (fields.get(field) ?? 0) + by);
  }

  observe(histogram: SignalHistogram, ms: number): void {
    for (const [field, by] of observationFields(histogram, ms)) this.count(field, by);
  }

  createAdmitted(waitMs: number): void {
    this.count('admitted');
    this.observe('wait', waitMs);
  }

  createRefused(code: string): void {
    this.count(`refused:${code}`);
  }

  taskEnded(succeeded: boolean): void {
    this.count('tasks');
    if (succeeded) this.count('tasks:ok');
  }

  start(): void {
    this.timer = setInterval(() => void this.flush(), this.deps.flushMs);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.flush();
  }

  /** Writes what is pending (one flush at a time; counters that fail to write are dropped, with a warning). */
  flush(): Promise<void> {
    this.flushing = this.flushing.then(() => this.flushOnce());
    return this.flushing;
  }

  private async flushOnce(): Promise<void> {
    const batch = this.pending;
    this.pending = new Map();
    try {
      await this.deps.store.add(batch);
      await this.raisePeaks();
    } catch (err) {
      this.deps.logger.warn({ err }, 'console signals not written');
    }
  }

  private async raisePeaks(): Promise<void> {
    const nowMs = this.deps.now();
    const bucketSec = bucketStartSecOf(nowMs);
    if (bucketSec !== this.peaks.bucketSec) this.peaks = { bucketSec, live: 0, node: 0 };
    const local = this.deps.nodes().filter((n) => n.healthy && n.pool === this.deps.localPool);
    const perNode = local.map((n) => Math.max(0, n.sandboxes - residentPoolOf(n)));
    const live = perNode.reduce((a, b) => a + b, 0);
    const node = Math.max(0, ...perNode);
    // Zeros are not worth a write: an empty bucket reads as no peak.
    if (live > this.peaks.live) {
      this.peaks.live = live;
      await this.deps.store.raiseMax(nowMs, 'peakLive', live);
    }
    if (node > this.peaks.node) {
      this.peaks.node = node;
      await this.deps.store.raiseMax(nowMs, 'peakNode', node);
    }
  }
}
