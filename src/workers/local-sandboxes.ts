import type { Sandbox } from '../api/index.ts';

/** An adopted sandbox's pause, from its record: paused (the port relay refuses it) and, paged out, what it still holds (see LocalSandboxes.reserved). */
export function pauseOf(record: Sandbox): { paused?: boolean; residentMiB?: number } {
  if (record.state !== 'paused') return {};
  return { paused: true, ...(record.swapped ? { residentMiB: Math.ceil(record.swapped.residentBytes / (1024 * 1024)) } : {}) };
}

/** A sandbox this worker host runs (or is starting), with what it reserved here. */
export interface LocalSandbox {
  id: string;
  memoryMiB: number;
  cpuMillis: number;
  diskMiB: number;
  expiresAtMs: number;
  /** Set while a create is in flight; cleared once running. */
  starting: boolean;
  /** While starting: the chunk cache its lazy layers may take (see AdmissionState.layerCache). */
  layerCacheBytes?: number;
  /**
   * Paused (frozen, or paged out too): set before its processes freeze and cleared once they
   * are thawed, so the port relay never opens a connection a frozen server would hold unanswered.
   */
  paused?: boolean;
  /** Paused with its memory paged out (pause mode `swap`): what it still holds in memory, counted instead of memoryMiB. */
  residentMiB?: number;
  /** A ready sandbox of a warm pool (no tenant yet, no registry record) and the pool version it was made for. */
  pool?: { name: string; version: string };
}

/** Requests handled recently, reported in heartbeats so gateways can drop assumed load. */
const HANDLED_WINDOW_MS = 15_000;

/**
 * The worker host's table of its sandboxes: what admission, heartbeats and TTLs read.
 * Heartbeats and the pool keeper read it every second or faster, so warm-pool sandboxes
 * are indexed apart and sums are taken without copying the table.
 */
export class LocalSandboxes {
  private readonly byId = new Map<string, LocalSandbox>();
  private readonly pooledById = new Map<string, LocalSandbox & { pool: { name: string; version: string } }>();
  private readonly handled: { sandboxId: string; atMs: number }[] = [];

  get size(): number {
    return this.byId.size;
  }

  has(id: string): boolean {
    return this.byId.has(id);
  }

  get(id: string): LocalSandbox | undefined {
    return this.byId.get(id);
  }

  set(sandbox: LocalSandbox): void {
    this.byId.set(sandbox.id, sandbox);
    if (sandbox.pool) this.pooledById.set(sandbox.id, sandbox as LocalSandbox & { pool: { name: string; version: string } });
    else this.pooledById.delete(sandbox.id);
  }

  delete(id: string): void {
    this.byId.delete(id);
    this.pooledById.delete(id);
  }

  ids(): string[] {
    return [...this.byId.keys()];
  }

  /** Running tenant sandboxes (not still starting, not a pool's). */
  running(): LocalSandbox[] {
    return [...this.byId.values()].filter((s) => !s.starting && !s.pool);
  }

  /** Sandboxes of warm pools, ready or starting. */
  pooled(): (LocalSandbox & { pool: { name: string; version: string } })[] {
    return [...this.pooledById.values()];
  }

  /** Chunk cache reserved by sandboxes still starting (their layers are not mounted yet). */
  startingLayerCacheBytes(): number {
    let sum = 0;
    for (const s of this.byId.values()) if (s.starting) sum += s.layerCacheBytes ?? 0;
    return sum;
  }

  startingCount(): number {
    let n = 0;
    for (const s of this.byId.values()) if (s.starting) n++;
    return n;
  }

  /**
   * Resources requested by every sandbox here, starting ones included. A sandbox paged out
   * (pause mode `swap`) counts the memory it still holds: what it gave back serves others.
   */
  reserved(): { memoryMiB: number; cpuMillis: number; diskMiB: number } {
    let memoryMiB = 0;
    let cpuMillis = 0;
    let diskMiB = 0;
    for (const s of this.byId.values()) {
      memoryMiB += s.residentMiB === undefined ? s.memoryMiB : Math.min(s.memoryMiB, s.residentMiB);
      cpuMillis += s.cpuMillis;
      diskMiB += s.diskMiB;
    }
    return { memoryMiB, cpuMillis, diskMiB };
  }

  /** Swap pauses' gift to admission: what swapped sandboxes reserved less what they still hold, MiB, and how many. */
  givenBack(): { givenBackMiB: number; swappedSandboxes: number } {
    let givenBackMiB = 0;
    let swappedSandboxes = 0;
    for (const s of this.byId.values()) {
      if (s.residentMiB === undefined) continue;
      givenBackMiB += s.memoryMiB - Math.min(s.memoryMiB, s.residentMiB);
      swappedSandboxes++;
    }
    return { givenBackMiB, swappedSandboxes };
  }

  /** A create request this host answered (admitted or refused). */
  noteHandled(sandboxId: string, atMs: number): void {
    this.handled.push({ sandboxId, atMs });
  }

  /** Creates answered within the window before `nowMs`. */
  recentlyHandled(nowMs: number): string[] {
    const cutoff = nowMs - HANDLED_WINDOW_MS;
    while (this.handled.length && this.handled[0]!.atMs < cutoff) this.handled.shift();
    return this.handled.map((h) => h.sandboxId);
  }
}
