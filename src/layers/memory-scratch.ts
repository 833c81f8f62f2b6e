import { randomBytes } from 'node:crypto';
import { mkdirSync, readdirSync, rmSync, statfsSync } from 'node:fs';
import path from 'node:path';
import { RollboxError } from '../api/index.ts';
import { processAlive } from '../proc/index.ts';

/** statfs(2)'s f_type of a tmpfs. */
const TMPFS_MAGIC = 0x01021994;

export interface MemoryReservation {
  /** A tmpfs directory to make a private subdirectory in. */
  dir: string;
  /** What the reservation holds: the tree extracted into it must stay within it. */
  bytes: number;
  release(): void;
}

/**
 * Room on a memory filesystem (tmpfs) for extracted layer trees, so that a pulled layer
 * reaches the disk once, as its EROFS metadata image and data blob, instead of twice (the
 * tree, then the image). Reservations share one budget; one that does not fit (the budget,
 * or the tmpfs's free space) is refused and the caller extracts to the disk as before.
 */
export class MemoryScratch {
  private reservedBytes = 0;

  constructor(
    private readonly dir: string,
    private readonly budgetBytes: number,
  ) {}

  /**
   * A directory of its own in `dir` (`rollbox-pulls-<pid>-<random>`: several gateways may
   * share a host and a process), after removing those of processes that are gone: what a
   * gateway killed mid-pull left there would hold memory until a reboot. None when `dir` is
   * not a tmpfs or the budget is 0 (every build on disk).
   */
  static at(dir: string, budgetBytes: number): MemoryScratch | undefined {
    if (budgetBytes <= 0) return undefined;
    try {
      if (statfsSync(dir).type !== TMPFS_MAGIC) return undefined;
      for (const name of readdirSync(dir)) {
        const pid = Number(/^rollbox-pulls-(\d+)-/.exec(name)?.[1]);
        if (pid && !processAlive(pid)) rmSync(path.join(dir, name), { recursive: true, force: true });
      }
      const own = path.join(dir, `rollbox-pulls-${process.pid}-${randomBytes(4).toString('hex')}`);
      mkdirSync(own, { mode: 0o700 });
      return new MemoryScratch(own, budgetBytes);
    } catch {
      return undefined;
    }
  }

  /** Room for `bytes`, or none (over the budget, the tmpfs too full, its directory gone): then on disk. */
  reserve(bytes: number): MemoryReservation | undefined {
    if (bytes > this.budgetBytes - this.reservedBytes) return undefined;
    let free: number;
    try {
      const fs = statfsSync(this.dir);
      free = fs.bavail * fs.bsize;
    } catch {
      return undefined;
    }
    if (free < bytes) return undefined;
    this.reservedBytes += bytes;
    let released = false;
    return {
      dir: this.dir,
      bytes,
      release: () => {
        if (released) return;
        released = true;
        this.reservedBytes -= bytes;
      },
    };
  }

  /** Its directory goes (the gateway stops; its pulls have ended). */
  remove(): void {
    rmSync(this.dir, { recursive: true, force: true });
  }

  get heldBytes(): number {
    return this.reservedBytes;
  }
}

/**
 * A tree outgrew its memory reservation (or the tmpfs filled): not the layer's fault, the
 * caller builds it again on disk.
 */
export class MemoryScratchFull extends Error {
  constructor(readonly reservedBytes: number) {
    super(`the extracted layer outgrew its ${reservedBytes}-byte memory reservation`);
  }
}

/**
 * Whether an extraction into a reservation of `reservedBytes` failed for want of room there
 * (the tmpfs full, or the reservation, where it is below the layer cap, exceeded) rather than
 * by the layer's own caps.
 */
export function outgrewReservation(err: unknown, reservedBytes: number, layerCapBytes: number): boolean {
  if (!(err instanceof Error)) return false;
  if (err instanceof RollboxError && err.code === 'payload_too_large') return reservedBytes < layerCapBytes && err.message.includes(`exceed ${reservedBytes} bytes`);
  return /ENOSPC/.test(err.message) || (err as NodeJS.ErrnoException).code === 'ENOSPC';
}
