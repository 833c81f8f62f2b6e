import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { RollboxError } from '../api/index.ts';

const run = promisify(execFile);

/** Built from src/swap/rollbox-memctl.c by scripts/build-memctl.sh. */
export const DEFAULT_MEMCTL_BINARY = path.resolve(import.meta.dirname, '../../build/rollbox-memctl');

/** Bounds a prefetch: reads of a whole sandbox's memory back from disk. */
const PREFETCH_TIMEOUT_MS = 120_000;

/**
 * Reads the swapped-out memory of these processes back in (rollbox-memctl: MADV_WILLNEED
 * queues every read at once, then each swapped anonymous page is waited for and mapped
 * again). Returns the bytes it waited for.
 */
export async function prefetchSwapped(pids: readonly number[], binary = DEFAULT_MEMCTL_BINARY): Promise<number> {
  if (pids.length === 0) return 0;
  try {
    const { stdout } = await run(binary, ['prefetch', ...pids.map(String)], { timeout: PREFETCH_TIMEOUT_MS });
    return Number(/^prefetched (\d+)$/m.exec(stdout)?.[1] ?? 0);
  } catch (err) {
    const stderr = (err as { stderr?: string }).stderr?.trim();
    throw new RollboxError('internal', `prefetch of swapped memory failed: ${stderr || (err instanceof Error ? err.message : String(err))} (build it with scripts/build-memctl.sh)`);
  }
}
