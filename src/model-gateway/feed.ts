import type { BlockingPool } from '../redis/index.ts';
import type { CallEntry, CallStore } from './calls.ts';

/** Where a client reads its call: `next` gives the next entry, 'timeout' after `timeoutMs` without one, null at the end. */
export interface EntrySource {
  next(timeoutMs: number): Promise<CallEntry | 'timeout' | null>;
  /** The next entry if one is here already (the pieces of a burst go out in one write). */
  poll(): CallEntry | undefined;
  close(): void;
}

/** A running call's entries in this process: its own client and retries that land on this gateway read them here. */
export class CallFeed {
  readonly entries: CallEntry[] = [];
  /** The call's end is in (after its record), or it was taken over: nothing more comes. */
  closed = false;
  private readonly wakers = new Set<() => void>();

  push(entry: CallEntry): void {
    this.entries.push(entry);
    this.wake();
  }

  end(): void {
    this.closed = true;
    this.wake();
  }

  /** Until there are more than `count` entries or the feed closes, at most `ms`. */
  waitFor(count: number, ms: number): Promise<void> {
    if (this.entries.length > count || this.closed) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.wakers.delete(done);
        resolve();
      };
      const timer = setTimeout(done, Math.max(0, ms));
      this.wakers.add(done);
    });
  }

  source(): EntrySource {
    let index = 0;
    return {
      next: async (timeoutMs) => {
        if (index >= this.entries.length && !this.closed) await this.waitFor(index, timeoutMs);
        if (index < this.entries.length) return this.entries[index++]!;
        return this.closed ? null : 'timeout';
      },
      poll: () => (index < this.entries.length ? this.entries[index++] : undefined),
      close: () => {},
    };
  }

  private wake(): void {
    for (const wake of [...this.wakers]) wake();
  }
}

export interface RemoteSourceDeps {
  calls: Pick<CallStore, 'follow' | 'leaseOf'>;
  blocking: BlockingPool;
  rolloutId: string;
  callId: string;
  bodyHash: string;
  leaseMs: number;
  now: () => number;
  /** The call's owner stopped renewing its lease (its gateway died): take it over (the new run writes to the same stream). */
  orphaned(): Promise<void>;
}

/**
 * A call run by another gateway (or one that ended), read from its Redis stream from the
 * start: a client's retry that landed here gets the whole answer. Between reads it checks
 * the owner's lease, and takes the call over when it lapsed.
 */
export class RemoteSource implements EntrySource {
  private readonly buffer: CallEntry[] = [];
  private lastId = '0';
  private ended = false;
  private closed = false;
  private nextLeaseCheckMs = 0;
  /** The call's in-flight record is gone (expired) or replaced: after one more read, nothing will come. */
  private gone = false;

  constructor(private readonly deps: RemoteSourceDeps) {}

  async next(timeoutMs: number): Promise<CallEntry | 'timeout' | null> {
    const { deps } = this;
    const deadline = deps.now() + timeoutMs;
    for (;;) {
      const entry = this.buffer.shift();
      if (entry) {
        if (entry.t === 'end') this.ended = true;
        return entry;
      }
      if (this.ended || this.closed) return null;
      if (deps.now() >= this.nextLeaseCheckMs) {
        this.nextLeaseCheckMs = deps.now() + deps.leaseMs / 2;
        const lease = await deps.calls.leaseOf(deps.rolloutId, deps.bodyHash);
        // Gone (expired) or replaced by a newer call with the same body: this call's stream is all there is.
        if (!lease || lease.callId !== deps.callId) {
          if (this.gone) return null;
          this.gone = true;
        } else if (lease.state === 'running' && lease.leaseUntil < deps.now()) await deps.orphaned();
      }
      const blockMs = Math.floor(Math.min(deadline - deps.now(), this.nextLeaseCheckMs - deps.now(), 1000));
      if (blockMs < 1) {
        if (deps.now() >= deadline) return 'timeout';
        continue;
      }
      const rows = await deps.blocking.with((connection) => deps.calls.follow(connection, deps.rolloutId, deps.callId, this.lastId, blockMs));
      for (const row of rows) {
        this.lastId = row.id;
        this.buffer.push(row.entry);
      }
      if (rows.length === 0 && deps.now() >= deadline) return 'timeout';
    }
  }

  poll(): CallEntry | undefined {
    const entry = this.buffer.shift();
    if (entry?.t === 'end') this.ended = true;
    return entry;
  }

  close(): void {
    this.closed = true;
  }
}
