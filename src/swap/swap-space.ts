import { execFile } from 'node:child_process';
import { chmod, mkdir, readFile, rm } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { RollboxError } from '../api/index.ts';

const run = promisify(execFile);
const KIB = 1024;
const MIB = 1024 * 1024;
/** Memory moves (page-out, prefetch) at once per host; see SwapSpace.oneAtATime. */
const MOVES_AT_ONCE = 2;

export interface SwapSpaceOptions {
  /** The swap file (on a filesystem that takes swap files: ext4, XFS; not tmpfs or overlayfs). */
  filePath: string;
  /** Its size; 0: this host swaps no sandbox (every swap pause is refused `swap_unavailable`). */
  sizeMiB: number;
}

/** One swap area as /proc/swaps lists it (sizes in bytes). */
export interface SwapArea {
  filename: string;
  sizeBytes: number;
  usedBytes: number;
}

/** /proc/swaps: `Filename Type Size Used Priority`, sizes in KiB; names escape spaces as \040. */
export function parseProcSwaps(text: string): SwapArea[] {
  return text
    .split('\n')
    .slice(1)
    .map((line) => line.trim().split(/\s+/))
    .filter((f) => f.length >= 4 && f[0])
    .map((f) => ({ filename: f[0]!.replace(/\\040/g, ' '), sizeBytes: Number(f[2]) * KIB, usedBytes: Number(f[3]) * KIB }));
}

/** Pages in memory that still hold a swap slot (host-wide; this file is the host's only swap area in practice). */
async function swapCachedBytes(): Promise<number> {
  const meminfo = await readFile('/proc/meminfo', 'utf8').catch(() => '');
  return Number(/^SwapCached:\s+(\d+) kB$/m.exec(meminfo)?.[1] ?? 0) * KIB;
}

/**
 * The swap file a worker host pages paused sandboxes out to: made and enabled at the first
 * swap pause (fallocate, mkswap, swapon), sized from config, and removed (swapoff, unlink)
 * when the host stops and destroys its sandboxes. A host that stops and leaves its sandboxes
 * running keeps it: they still have memory in it, and the next start on the same data dir
 * finds it enabled and goes on with it.
 *
 * Room is counted against the file's own free space as /proc/swaps reports it, plus the
 * slots of pages read back but still in the swap cache (/proc/meminfo SwapCached: a resumed
 * sandbox's pages keep their slots, and paging them out again reuses them without a write),
 * less what swap-outs in flight have claimed (`reserve`), so concurrent pauses cannot
 * together promise more than the file holds.
 */
export class SwapSpace {
  private enabling?: Promise<void>;
  private claimedBytes = 0;
  private running = 0;
  private readonly waiting: (() => void)[] = [];

  constructor(private readonly options: SwapSpaceOptions) {}

  get configured(): boolean {
    return this.options.sizeMiB > 0;
  }

  get filePath(): string {
    return this.options.filePath;
  }

  /** This file's line of /proc/swaps (undefined: not enabled). */
  async area(): Promise<SwapArea | undefined> {
    const text = await readFile('/proc/swaps', 'utf8').catch(() => '');
    return parseProcSwaps(text).find((a) => a.filename === this.options.filePath);
  }

  /**
   * Room for `bytes` of a sandbox's memory, claimed until the returned release is called
   * (the swap-out is done and /proc/swaps shows what it used). Refused `swap_unavailable`
   * when the host has no swap space for sandboxes, cannot enable it, or it is too full.
   */
  async reserve(bytes: number): Promise<() => void> {
    if (!this.configured) throw new RollboxError('swap_unavailable', 'this worker host has no swap space for sandboxes (ROLLBOX_SWAP_FILE_MIB is 0)');
    await this.enable();
    const area = await this.area();
    if (!area) {
      this.enabling = undefined; // swapped off from outside: the next swap pause enables it again
      throw new RollboxError('swap_unavailable', `the swap file ${this.options.filePath} is no longer enabled on this worker host`);
    }
    const freeBytes = area.sizeBytes - area.usedBytes + Math.min(await swapCachedBytes(), area.usedBytes) - this.claimedBytes;
    if (bytes > freeBytes) {
      throw new RollboxError(
        'swap_unavailable',
        `the worker host's swap space is too full: the sandbox holds ${Math.ceil(bytes / MIB)} MiB, ${Math.max(0, Math.floor(freeBytes / MIB))} MiB of ${Math.floor(area.sizeBytes / MIB)} MiB free`,
      );
    }
    this.claimedBytes += bytes;
    let released = false;
    return () => {
      if (!released) this.claimedBytes -= bytes;
      released = true;
    };
  }

  /**
   * Page-outs and prefetches run MOVES_AT_ONCE at a time on a host: each keeps a core busy
   * in the kernel (and a libuv thread: the worker's own file reads, its heartbeat's among
   * them, must not queue behind a job's 32 page-outs), and the disk reads them in order.
   */
  async oneAtATime<T>(fn: () => Promise<T>): Promise<T> {
    if (this.running >= MOVES_AT_ONCE) await new Promise<void>((resolve) => this.waiting.push(resolve));
    this.running++;
    try {
      return await fn();
    } finally {
      this.running--;
      this.waiting.shift()?.();
    }
  }

  /** Made and enabled once; a failed attempt is tried again by the next swap pause. */
  private enable(): Promise<void> {
    this.enabling ??= this.makeAndEnable().catch((err: unknown) => {
      this.enabling = undefined;
      throw err instanceof RollboxError ? err : new RollboxError('swap_unavailable', `could not enable the swap file ${this.options.filePath}: ${err instanceof Error ? err.message : String(err)}`);
    });
    return this.enabling;
  }

  private async makeAndEnable(): Promise<void> {
    if (await this.area()) return;
    const file = this.options.filePath;
    await mkdir(path.dirname(file), { recursive: true });
    await rm(file, { force: true });
    try {
      // Allocated, not sparse: swapon refuses files with holes.
      await run('fallocate', ['-l', String(this.options.sizeMiB * MIB), file]);
      await chmod(file, 0o600);
      await run('mkswap', [file]);
      await run('swapon', [file]);
    } catch (err) {
      await rm(file, { force: true });
      const stderr = (err as { stderr?: string }).stderr?.trim();
      throw new RollboxError('swap_unavailable', `could not enable the swap file ${file}: ${stderr || (err instanceof Error ? err.message : String(err))}`);
    }
  }

  /** swapoff (whatever is still in it comes back into memory) and unlink. Safe to call twice. */
  async remove(): Promise<void> {
    await this.enabling?.catch(() => undefined);
    this.enabling = undefined;
    if (await this.area()) await run('swapoff', [this.options.filePath]);
    await rm(this.options.filePath, { force: true });
  }
}
