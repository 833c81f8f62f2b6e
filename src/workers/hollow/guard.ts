import { realpathSync } from 'node:fs';
import path from 'node:path';

/** The repository's bench/ folder: the only scripts that may start hollow hosts. */
const BENCH_DIR = path.resolve(import.meta.dirname, '../../../bench');

/**
 * Hollow worker hosts run nothing: a gateway that placed a real sandbox on one would
 * answer `running` for a sandbox that does not exist. So they start only in a process
 * whose entry script is a benchmark of this repository (`tsx bench/...`), never in
 * `rollbox worker` or `rollbox up`, a test runner or anything importing rollbox as a
 * library; no flag or variable turns this off. (They also heartbeat in pool `hollow`
 * only, where no gateway outside a benchmark places.)
 */
export function refuseOutsideBenchmarks(entryScript: string | undefined = process.argv[1]): void {
  const rel = entryScript ? path.relative(safeRealpath(BENCH_DIR), safeRealpath(entryScript)) : '..';
  const inBench = rel !== '' && !rel.startsWith('..') && !path.isAbsolute(rel);
  if (!inBench) throw new Error(`hollow worker hosts run only in benchmarks (a script under ${BENCH_DIR}); this process runs ${entryScript ?? 'no script'}`);
}

function safeRealpath(p: string): string {
  try {
    return realpathSync(p);
  } catch {
    return path.resolve(p);
  }
}
