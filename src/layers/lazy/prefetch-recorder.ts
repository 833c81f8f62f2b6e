import type { LazyLayersLogger, PrefetchStore } from './types.ts';

const RECORD_FLUSH_MS = 1000;

/** Collects the chunks reads asked for and hands them to the prefetch store about once a second. */
export class PrefetchRecorder {
  private readonly toRecord = new Map<string, Set<number>>();
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly store: PrefetchStore | undefined,
    private readonly logger?: LazyLayersLogger,
  ) {}

  note(digest: string, first: number, count: number): void {
    const set = this.toRecord.get(digest) ?? new Set<number>();
    for (let i = first; i < first + count; i++) set.add(i);
    this.toRecord.set(digest, set);
    this.timer ??= setTimeout(() => void this.flush(), RECORD_FLUSH_MS);
  }

  async flush(): Promise<void> {
    clearTimeout(this.timer);
    this.timer = undefined;
    const batch = [...this.toRecord];
    this.toRecord.clear();
    for (const [digest, chunks] of batch) await this.store?.record(digest, [...chunks]).catch((err: unknown) => this.logger?.warn({ digest, err: String(err) }, 'recording a prefetch list failed'));
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
