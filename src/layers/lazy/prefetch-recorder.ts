import type { LazyLayersLogger, PrefetchStore } from './types.ts';

const RECORD_FLUSH_MS = 1000;

interface Run {
  /** Whether the store counts this run (one of a layer's first). */
  opened: Promise<boolean>;
  untilMs: number;
  seen: Set<number>;
  pending: Set<number>;
}

/**
 * The reads of this host's first run of each layer (from a mount with nothing of it cached,
 * for `windowMs`), handed to the prefetch store about once a second, each chunk once.
 */
export class PrefetchRecorder {
  private readonly runs = new Map<string, Run>();
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly store: PrefetchStore | undefined,
    private readonly windowMs: number,
    private readonly logger?: LazyLayersLogger,
  ) {}

  /** A first run of the layer starts here (a run already recording goes on). */
  startRun(digest: string): void {
    const known = this.runs.get(digest);
    if (!this.store || (known && Date.now() <= known.untilMs)) return;
    const opened = this.store.openRun(digest).catch((err: unknown) => {
      this.logger?.warn({ digest, err: String(err) }, 'opening a prefetch record failed');
      return false;
    });
    this.runs.set(digest, { opened, untilMs: Date.now() + this.windowMs, seen: new Set(), pending: new Set() });
  }

  note(digest: string, first: number, count: number): void {
    const run = this.runs.get(digest);
    if (!run || Date.now() > run.untilMs) return;
    for (let i = first; i < first + count; i++) {
      if (run.seen.has(i)) continue;
      run.seen.add(i);
      run.pending.add(i);
    }
    this.timer ??= setTimeout(() => void this.flush(), RECORD_FLUSH_MS);
  }

  async flush(): Promise<void> {
    clearTimeout(this.timer);
    this.timer = undefined;
    for (const [digest, run] of [...this.runs]) {
      const chunks = [...run.pending];
      run.pending.clear();
      if (Date.now() > run.untilMs) this.runs.delete(digest);
      if (chunks.length && (await run.opened)) await this.store?.record(digest, chunks).catch((err: unknown) => this.logger?.warn({ digest, err: String(err) }, 'recording a prefetch list failed'));
    }
    if ([...this.runs.values()].some((r) => r.pending.size)) this.timer ??= setTimeout(() => void this.flush(), RECORD_FLUSH_MS);
  }
}

/** Sorted chunk indexes as runs of neighbours, each at most `maxRun` long. */
export function runsOf(sorted: readonly number[], maxRun: number): { first: number; count: number }[] {
  const runs: { first: number; count: number }[] = [];
  for (const i of sorted) {
    const last = runs.at(-1);
    if (last && last.first + last.count === i && last.count < maxRun) last.count++;
    else runs.push({ first: i, count: 1 });
  }
  return runs;
}
