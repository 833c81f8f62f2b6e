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
 */
export class NodeDirectory {
  private observed = new Map<string, Observed>();
  private readonly assumptions = new Map<string, Assumption[]>();
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

  async refresh(): Promise<void> {
    const raw = await this.redis.hgetall(keys.nodes);
    const now = this.options.now();
    const next = new Map<string, Observed>();
    for (const [nodeId, json] of Object.entries(raw)) {
      const parsed = NodeHeartbeat.safeParse(safeJson(json));
      if (!parsed.success) continue;
      const heartbeat = parsed.data;
      const previous = this.observed.get(nodeId);
      const changed = !previous || previous.heartbeat.atMs !== heartbeat.atMs;
      next.set(nodeId, { heartbeat, changedAtMs: changed ? now : previous.changedAtMs });
      if (changed) this.clearHandled(nodeId, heartbeat.handledCreates);
    }
    for (const nodeId of this.assumptions.keys()) if (!next.has(nodeId)) this.assumptions.delete(nodeId);
    this.observed = next;
  }

  private clearHandled(nodeId: string, handled: readonly string[]): void {
    const list = this.assumptions.get(nodeId);
    if (!list) return;
    const done = new Set(handled);
    const now = this.options.now();
    const kept = list.filter((a) => !done.has(a.sandboxId) && now - a.placedAtMs < ASSUMPTION_MAX_AGE_MS);
    if (kept.length) this.assumptions.set(nodeId, kept);
    else this.assumptions.delete(nodeId);
  }

  candidates(): PlacementCandidate[] {
    const now = this.options.now();
    return [...this.observed.values()].map(({ heartbeat, changedAtMs }) => ({
      heartbeat,
      ageMs: now - changedAtMs,
      assumed: sumAssumed(this.assumptions.get(heartbeat.nodeId) ?? []),
    }));
  }

  /** Load placed on a node, counted until its heartbeat shows it (once per sandbox). */
  assume(nodeId: string, sandboxId: string, load: { memoryMiB: number; cpuMillis: number }): void {
    const list = this.assumptions.get(nodeId) ?? [];
    if (list.some((a) => a.sandboxId === sandboxId)) return;
    list.push({ sandboxId, placedAtMs: this.options.now(), sandboxes: 1, ...load });
    this.assumptions.set(nodeId, list);
  }

  /** The node answered (refused) this request: its load no longer includes it. */
  forget(nodeId: string, sandboxId: string): void {
    this.clearHandled(nodeId, [sandboxId]);
  }

  /** True when the node is gone from Redis or its heartbeat has not changed for `lostAfterMs`. */
  isSilent(nodeId: string, lostAfterMs: number): boolean {
    const observed = this.observed.get(nodeId);
    return !observed || this.options.now() - observed.changedAtMs > lostAfterMs;
  }

  /** Nodes whose heartbeat has not changed for `lostAfterMs`. */
  silentNodes(lostAfterMs: number): string[] {
    const now = this.options.now();
    return [...this.observed.values()].filter((o) => now - o.changedAtMs > lostAfterMs).map((o) => o.heartbeat.nodeId);
  }

  /** Where a worker host's port relay listens (src/ports), as its last heartbeat says. */
  portRelayOf(nodeId: string): string | undefined {
    return this.observed.get(nodeId)?.heartbeat.portRelay;
  }

  list(): (NodeHeartbeat & { ageMs: number })[] {
    return this.candidates().map((c) => ({ ...c.heartbeat, ageMs: c.ageMs }));
  }
}

function sumAssumed(list: readonly Assumption[]): AssumedLoad {
  return list.reduce((acc, a) => ({ memoryMiB: acc.memoryMiB + a.memoryMiB, cpuMillis: acc.cpuMillis + a.cpuMillis, sandboxes: acc.sandboxes + 1 }), { memoryMiB: 0, cpuMillis: 0, sandboxes: 0 });
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}
