import type { Redis } from 'ioredis';
import { NodeHeartbeat } from '../api/index.ts';
import { keys } from '../registry/index.ts';
import type { AssumedLoad, PlacementCandidate } from './placement.ts';

interface Observed {
  heartbeat: NodeHeartbeat;
  /** Local time at which this node's heartbeat last changed (clock-skew safe). */
  changedAtMs: number;
}

interface Assumption extends AssumedLoad {
  sandboxId: string;
  placedAtMs: number;
}

/** A safety net only: assumptions normally clear when a heartbeat reports the request handled. */
const ASSUMPTION_MAX_AGE_MS = 120_000;

/**
 * A gateway's view of the worker hosts: heartbeats read from Redis about once a second,
 * plus the placements this gateway made that the heartbeats do not show yet.
 *
 * A heartbeat's age is measured up to the last read, not up to now: a gateway whose own
 * reads fall behind (its event loop saturated by a burst of thousands of creates) knows
 * nothing newer, and must not take its own lateness for the hosts' silence (it had failed
 * most of such a burst, each create "refused" by a host that had stopped heartbeating, and
 * its janitor could have declared live hosts lost).
 *
 * Nor is silence counted while the directory could not see: a read that failed, or took
 * longer than a refresh interval (Redis failing over: ioredis retries for up to 15 s), hid
 * the heartbeats from it, and the hosts' own writes were most likely held up the same way.
 * Each host gets its full lost time from the moment reads come back (a failover had made
 * the janitor declare a live host lost: the CI flake of redis-cluster-failover).
 */
export class NodeDirectory {
  private observed = new Map<string, Observed>();
  private readonly assumptions = new Map<string, Assumption[]>();
  /** Each node's assumptions summed (candidates() is asked once per placement). */
  private readonly assumedSums = new Map<string, AssumedLoad>();
  /** Local time at which the last completed refresh read the heartbeats. */
  private readAtMs = 0;
  /**
   * Local time from which reads have come back promptly, without a gap: silence before it is
   * not counted. Infinity while the last read failed (or before the first): nothing is silent.
   */
  private seeingSinceMs = Infinity;
  private refreshing: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly redis: Redis,
    private readonly options: { refreshMs: number; now: () => number },
  ) {}

  async start(): Promise<void> {
    await this.refresh();
    this.timer = setInterval(() => void this.refresh().catch(() => {}), this.options.refreshMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }

  /** Reads the heartbeats; a refresh asked while one is under way joins it (under load they would pile up). */
  refresh(): Promise<void> {
    this.refreshing ??= this.read().finally(() => (this.refreshing = undefined));
    return this.refreshing;
  }

  private async read(): Promise<void> {
    const readAtMs = this.options.now();
    let raw: Record<string, string>;
    try {
      raw = await this.redis.hgetall(keys.nodes);
    } catch (err) {
      this.seeingSinceMs = Infinity;
      throw err;
    }
    const answeredAtMs = this.options.now();
    if (this.seeingSinceMs === Infinity || answeredAtMs - readAtMs > this.options.refreshMs) this.seeingSinceMs = answeredAtMs;
    const next = new Map<string, Observed>();
    for (const [nodeId, json] of Object.entries(raw)) {
      const parsed = NodeHeartbeat.safeParse(safeJson(json));
      if (!parsed.success) continue;
      const heartbeat = parsed.data;
      const previous = this.observed.get(nodeId);
      const changed = !previous || previous.heartbeat.atMs !== heartbeat.atMs;
      next.set(nodeId, { heartbeat, changedAtMs: changed ? readAtMs : previous.changedAtMs });
      if (changed) this.clearHandled(nodeId, heartbeat.handledCreates);
    }
    for (const nodeId of this.assumptions.keys()) if (!next.has(nodeId)) this.setAssumptions(nodeId, []);
    this.observed = next;
    this.readAtMs = readAtMs;
  }

  private clearHandled(nodeId: string, handled: readonly string[]): void {
    const list = this.assumptions.get(nodeId);
    if (!list) return;
    const done = new Set(handled);
    const now = this.options.now();
    this.setAssumptions(nodeId, list.filter((a) => !done.has(a.sandboxId) && now - a.placedAtMs < ASSUMPTION_MAX_AGE_MS));
  }

  private setAssumptions(nodeId: string, list: Assumption[]): void {
    if (list.length === 0) {
      this.assumptions.delete(nodeId);
      this.assumedSums.delete(nodeId);
      return;
    }
    this.assumptions.set(nodeId, list);
    this.assumedSums.set(nodeId, sumAssumed(list));
  }

  /** How long before the last read the node's heartbeat last changed, counting only time the directory could see. */
  private ageOf(observed: Observed): number {
    return Math.max(0, this.readAtMs - Math.max(observed.changedAtMs, this.seeingSinceMs));
  }

  candidates(): PlacementCandidate[] {
    return [...this.observed.values()].map((o) => ({ heartbeat: o.heartbeat, ageMs: this.ageOf(o), assumed: this.assumedSums.get(o.heartbeat.nodeId) ?? NOTHING_ASSUMED }));
  }

  /** Load placed on a node, counted until its heartbeat shows it (once per sandbox). */
  assume(nodeId: string, sandboxId: string, load: { memoryMiB: number; cpuMillis: number }): void {
    const list = this.assumptions.get(nodeId) ?? [];
    if (list.some((a) => a.sandboxId === sandboxId)) return;
    list.push({ sandboxId, placedAtMs: this.options.now(), sandboxes: 1, memoryMiB: load.memoryMiB, cpuMillis: load.cpuMillis });
    this.setAssumptions(nodeId, list);
  }

  /** The node answered (refused) this request: its load no longer includes it. */
  forget(nodeId: string, sandboxId: string): void {
    this.clearHandled(nodeId, [sandboxId]);
  }

  /** True when the node is gone from Redis or its heartbeat had not changed for `lostAfterMs` at the last read. */
  isSilent(nodeId: string, lostAfterMs: number): boolean {
    const observed = this.observed.get(nodeId);
    return !observed || this.ageOf(observed) > lostAfterMs;
  }

  /** Nodes whose heartbeat had not changed for `lostAfterMs` at the last read. */
  silentNodes(lostAfterMs: number): string[] {
    return [...this.observed.values()].filter((o) => this.ageOf(o) > lostAfterMs).map((o) => o.heartbeat.nodeId);
  }

  /** Where a worker host's port relay listens (src/ports), as its last heartbeat says. */
  portRelayOf(nodeId: string): string | undefined {
    return this.observed.get(nodeId)?.heartbeat.portRelay;
  }

  list(): (NodeHeartbeat & { ageMs: number })[] {
    return this.candidates().map((c) => ({ ...c.heartbeat, ageMs: c.ageMs }));
  }
}

const NOTHING_ASSUMED: AssumedLoad = Object.freeze({ memoryMiB: 0, cpuMillis: 0, sandboxes: 0 });

function sumAssumed(list: readonly Assumption[]): AssumedLoad {
  const sum = { memoryMiB: 0, cpuMillis: 0, sandboxes: list.length };
  for (const a of list) {
    sum.memoryMiB += a.memoryMiB;
    sum.cpuMillis += a.cpuMillis;
  }
  return sum;
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}
