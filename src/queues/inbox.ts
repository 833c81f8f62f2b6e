import type { Redis } from 'ioredis';
import { keys } from '../registry/index.ts';
import { LuaScript } from '../redis/index.ts';

/**
 * Each worker host's ops inbox: operations on its sandboxes (exec, files, signals, pause,
 * snapshot, delete...) in a Redis list pushed by gateways, and a `taken` list holding what
 * this host is working on. A message moves from the inbox to `taken` atomically when the host takes it
 * (BLMOVE) and leaves `taken` when it is done, so a host that dies mid-way finds its
 * unfinished messages again at its next start and takes them anew: delivery is
 * at-least-once, and every handler is idempotent by the message's id (an exec by its
 * command record), except stdin, which cannot be: its handler acknowledges first
 * (ackInbox), making it at-most-once.
 *
 * Operations stay off BullMQ (creates, runs and wakes are BullMQ jobs: src/queues/jobs): an
 * inbox message costs 2 Redis calls (push, take) plus its ack, which rides on the
 * handler's own last script where it can (an exec's result), on a path of a few ms; a
 * BullMQ job costs several scripts, a lock and its renewals (docs/operations.md has the
 * measured counts).
 */
export type InboxLane = 'ops';

export function inboxKey(nodeId: string, lane: InboxLane): string {
  return keys.inbox(nodeId, lane);
}

/** What a handler needs to acknowledge its message itself, inside its own last script. */
export interface InboxReceipt {
  takenKey: string;
  raw: string;
  /** Set once the handler removed the message from `taken` itself. */
  acked: boolean;
}

export interface InboxConsumerOptions {
  nodeId: string;
  lane: InboxLane;
  /** Commands (acks, requeue). */
  redis: Redis;
  /** A connection of its own: BLMOVE blocks it. */
  blocking: Redis;
  /** Messages handled at once; past it, the next stays in the inbox. */
  concurrency: number;
  handle: (message: unknown, receipt: InboxReceipt) => Promise<void>;
  onError: (err: unknown) => void;
  /** How long one BLMOVE waits before it is sent again (bounds stop latency). */
  blockSeconds?: number;
}

const REQUEUE = new LuaScript(import.meta.dirname, 'requeue-taken');

export class InboxConsumer {
  private stopped = false;
  private inFlight = 0;
  private slotFreed: (() => void) | undefined;
  private loop: Promise<void> | undefined;
  readonly inboxKey: string;
  readonly takenKey: string;

  constructor(private readonly options: InboxConsumerOptions) {
    this.inboxKey = inboxKey(options.nodeId, options.lane);
    this.takenKey = `${this.inboxKey}:taken`;
  }

  get busy(): number {
    return this.inFlight;
  }

  /** Requeues the previous process's unfinished messages, then takes messages until stopped. */
  async start(): Promise<number> {
    const requeued = Number(await REQUEUE.run(this.options.redis, [this.takenKey, this.inboxKey], []));
    this.loop = this.run();
    return requeued;
  }

  private async run(): Promise<void> {
    const { blocking, concurrency } = this.options;
    const blockSeconds = this.options.blockSeconds ?? 5;
    while (!this.stopped) {
      if (this.inFlight >= concurrency) {
        await new Promise<void>((resolve) => (this.slotFreed = resolve));
        continue;
      }
      let raw: string | null;
      try {
        raw = await blocking.blmove(this.inboxKey, this.takenKey, 'RIGHT', 'LEFT', blockSeconds);
      } catch (err) {
        if (this.stopped) return;
        this.options.onError(err);
        await new Promise((r) => setTimeout(r, 200));
        continue;
      }
      if (raw !== null) this.dispatch(raw);
    }
  }

  private dispatch(raw: string): void {
    this.inFlight++;
    const receipt: InboxReceipt = { takenKey: this.takenKey, raw, acked: false };
    let message: unknown;
    try {
      message = JSON.parse(raw);
    } catch {
      message = undefined;
    }
    void this.options
      .handle(message, receipt)
      .catch((err: unknown) => this.options.onError(err))
      .then(async () => {
        if (!receipt.acked) await ackInbox(this.options.redis, receipt);
      })
      .catch((err: unknown) => this.options.onError(err))
      .finally(() => {
        this.inFlight--;
        this.slotFreed?.();
        this.slotFreed = undefined;
      });
  }

  /**
   * Stops taking messages. Messages being handled stay in `taken` until their handler
   * ends; a process that exits first leaves them for its successor.
   */
  async stop(): Promise<void> {
    this.stopped = true;
    this.slotFreed?.();
    // A BLMOVE in progress would hold the stop for up to blockSeconds.
    this.options.blocking.disconnect();
    await this.loop?.catch(() => undefined);
  }
}

/** Takes a message out of `taken` now, before its handler has done its work: that work is then never redone after a restart. */
export async function ackInbox(redis: Redis, receipt: InboxReceipt): Promise<void> {
  await redis.lrem(receipt.takenKey, 1, receipt.raw);
  receipt.acked = true;
}

/** Pushes a message to a node's inbox (gateways). */
export async function pushToInbox(redis: Redis, nodeId: string, lane: InboxLane, message: object): Promise<void> {
  await redis.lpush(inboxKey(nodeId, lane), JSON.stringify(message));
}

/** Messages in a node's ops inbox and `taken` list (what a lost or restarted node left). */
export async function pendingOps(redis: Redis, nodeId: string, options: { includeQueued: boolean }): Promise<unknown[]> {
  const key = inboxKey(nodeId, 'ops');
  const [taken, queued] = await Promise.all([redis.lrange(`${key}:taken`, 0, -1), options.includeQueued ? redis.lrange(key, 0, -1) : Promise.resolve([])]);
  return [...taken, ...queued].flatMap((raw) => {
    try {
      return [JSON.parse(raw) as unknown];
    } catch {
      return [];
    }
  });
}

/**
 * Exec messages this node took for `commandIds` of one sandbox, taken out of its `taken`
 * list: a sandbox that hibernated whole with those commands running carries them to the
 * host that wakes it (which pushes them to its own inbox: handOverOps). `keep` runs with
 * the raw messages before they leave the list, so a host that dies in between still has them.
 */
export async function takeOutExecOps(redis: Redis, nodeId: string, sandboxId: string, commandIds: readonly string[], keep: (raws: string[]) => Promise<void>): Promise<string[]> {
  const takenKey = `${inboxKey(nodeId, 'ops')}:taken`;
  const wanted = new Set(commandIds);
  const raws = (await redis.lrange(takenKey, 0, -1)).filter((raw) => {
    try {
      const m = JSON.parse(raw) as { kind?: string; sandboxId?: string; commandId?: string };
      return m.kind === 'exec' && m.sandboxId === sandboxId && wanted.has(m.commandId ?? '');
    } catch {
      return false;
    }
  });
  if (!raws.length) return raws;
  await keep(raws);
  const pipeline = redis.pipeline();
  for (const raw of raws) pipeline.lrem(takenKey, 1, raw);
  await pipeline.exec();
  return raws;
}

/** Messages another host took, handed to this node's inbox as they were (in their order). */
export async function handOverOps(redis: Redis, nodeId: string, raws: readonly string[]): Promise<void> {
  if (raws.length) await redis.lpush(inboxKey(nodeId, 'ops'), ...raws);
}
