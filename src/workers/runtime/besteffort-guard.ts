import { readFileSync, writeFileSync } from 'node:fs';
import { CPU_PERIOD_US } from './spec.ts';

/**
 * Holds besteffort sandboxes back while a caller waits on a latency sandbox's command.
 *
 * SCHED_IDLE and cpu.idle keep besteffort work off a CPU a latency task wants, but not
 * off the CPU next to it. Without core scheduling (this kernel has none, see DESIGN.md)
 * a besteffort busy loop on the other vCPU still slows latency work through what the two
 * share underneath: on this 2-vCPU machine a SCHED_IDLE spin on the *other* vCPU slowed
 * `runc --version` by 40-70% and a fork-heavy shell loop by 45-90%, with no run-queue
 * contention at all. Core scheduling answers that by idling a latency task's siblings;
 * this guard does the same at host granularity: while any guarded command runs, every
 * besteffort sandbox of this host is capped at `heldQuotaUs` per 100 ms period (default
 * the kernel's smallest, 1 ms), and its own quota comes back when the last guarded
 * command ends or after `maxHoldMs`, so a long build does not starve besteffort work for
 * its whole run.
 *
 * The cap is written per sandbox: cgroup v1 refuses a parent quota below a child's.
 */
/** The kernel's smallest CFS quota: 1% of a CPU at the 100 ms period sandboxes use. */
export const MIN_HELD_QUOTA_US = 1000;

export interface BesteffortGuardDeps {
  /** cpu.cfs_quota_us of every besteffort sandbox this host runs now (more sources: addQuotaFiles). */
  quotaFiles?: () => string[];
  /** How long one command may hold besteffort sandboxes back; 0 turns the guard off. */
  maxHoldMs: number;
  /** Each held sandbox's CFS quota (per 100 ms period); default MIN_HELD_QUOTA_US. */
  heldQuotaUs?: number;
  onError?: (file: string, err: unknown) => void;
}

export class BesteffortGuard {
  private holders = 0;
  /** The quota each capped sandbox had before, to give back. */
  private readonly saved = new Map<string, string>();

  private readonly heldQuotaUs: number;
  private readonly sources: (() => string[])[] = [];

  constructor(private readonly deps: BesteffortGuardDeps) {
    this.heldQuotaUs = Math.max(MIN_HELD_QUOTA_US, deps.heldQuotaUs ?? MIN_HELD_QUOTA_US);
    if (deps.quotaFiles) this.sources.push(deps.quotaFiles);
  }

  /** Another runtime's besteffort sandboxes (a host's microVMs beside its containers): held back together. */
  addQuotaFiles(source: () => string[]): void {
    this.sources.push(source);
  }

  get engaged(): boolean {
    return this.holders > 0;
  }

  /** Caps besteffort sandboxes until the returned release is called or maxHoldMs passes. */
  hold(): () => void {
    if (this.deps.maxHoldMs <= 0) return () => undefined;
    if (this.holders++ === 0) this.cap();
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      clearTimeout(timer);
      if (--this.holders === 0) this.restore();
    };
    const timer = setTimeout(release, this.deps.maxHoldMs);
    timer.unref();
    return release;
  }

  /** A besteffort sandbox that starts during a hold is held back with the others. */
  started(quotaFile: string): void {
    if (this.holders > 0) this.capOne(quotaFile);
  }

  private cap(): void {
    for (const source of this.sources) for (const file of source()) this.capOne(file);
  }

  private capOne(file: string): void {
    try {
      const quota = readFileSync(file, 'utf8').trim();
      // An unlimited sandbox (-1) is capped too; one already at or below the cap is left alone.
      if (quota !== '-1' && Number(quota) <= this.heldQuotaUs) return;
      writeFileSync(file, String(this.heldQuotaUs));
      this.saved.set(file, quota);
    } catch (err) {
      this.deps.onError?.(file, err);
    }
  }

  private restore(): void {
    for (const [file, quota] of this.saved) {
      try {
        writeFileSync(file, quota);
      } catch (err) {
        // Gone with its sandbox: nothing to give back.
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') this.deps.onError?.(file, err);
      }
    }
    this.saved.clear();
  }
}

/** A host's guard as its config says: hold for at most `holdMs`, each held sandbox keeping `heldCpuMillis`. */
export function besteffortGuardOf(options: { holdMs: number; heldCpuMillis?: number; onError?: BesteffortGuardDeps['onError'] }): BesteffortGuard {
  return new BesteffortGuard({ maxHoldMs: options.holdMs, ...(options.heldCpuMillis === undefined ? {} : { heldQuotaUs: options.heldCpuMillis * (CPU_PERIOD_US / 1000) }), ...(options.onError ? { onError: options.onError } : {}) });
}
