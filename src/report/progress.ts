export interface ProgressBar {
  /** Set the fraction done (0..1), with an optional note after the bar. */
  update(fraction: number, note?: string): void;
  /** One more of `total` done (the note is then `count/total`). */
  tick(): void;
  done(): void;
}

/**
 * A one-line bar on stderr (commands and benches print their results on stdout). It is
 * redrawn only when the whole percent or the note changes, so a million ticks cost
 * a hundred writes; `enabled: false` (a pipe, a test) draws nothing.
 */
export function progressBar(label: string, options: { total?: number; enabled?: boolean } = {}): ProgressBar {
  const enabled = options.enabled ?? true;
  const total = options.total ?? 1;
  let last = '';
  let count = 0;
  const bar: ProgressBar = {
    update(fraction, note = '') {
      if (!enabled) return;
      const percent = Math.floor(fraction * 100);
      if (`${percent} ${note}` === last) return;
      last = `${percent} ${note}`;
      const width = 30;
      const filled = Math.round(Math.min(1, Math.max(0, fraction)) * width);
      process.stderr.write(`\r${label.padEnd(24)} [${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${String(percent).padStart(3)}% ${note}`);
    },
    tick() {
      count++;
      // The note changes with every tick; draw only when the percent moves (and at the end).
      if (count === total || Math.floor((count / total) * 100) !== Math.floor(((count - 1) / total) * 100)) bar.update(count / total, `${count}/${total}`);
    },
    done() {
      if (enabled) process.stderr.write('\n');
    },
  };
  bar.update(0, options.total === undefined ? '' : `0/${total}`);
  return bar;
}
