import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { RollboxError, type RuntimeMetrics } from '../../api/index.ts';
import type { RuntimeContext } from './context.ts';
import { SANDBOX_BUSYBOX } from './spec.ts';
import type { RuntimeRawExecOutcome, RuntimeRawExecSpec } from './types.ts';

/** A reading older than this is not a window's start: a fresh window is measured instead. */
const MAX_WINDOW_MS = 60_000;
/** Shortest window CPU use is averaged over (a fresh one is measured on the spot). */
const MIN_WINDOW_MS = 200;
/** Last readings kept (one per sandbox asked lately). */
const MAX_READINGS = 10_000;

const readNumber = async (file: string): Promise<number> => Number((await readFile(file, 'utf8')).trim());

/**
 * A sandbox's resource use from what the host keeps of it: its CPU time (the cpuacct
 * cgroup's `cpuacct.usage`, nanoseconds, v1), its memory cgroup's usage and page cache
 * (`memory.usage_in_bytes`, `memory.stat`), and its own disk: statfs of its root, asked
 * inside the sandbox (its overlay reports the capped filesystem its upper dir is on, which
 * the host does not keep mounted while it runs). CPU is a rate: the window runs from this
 * sandbox's previous reading when that is recent, else over MIN_WINDOW_MS measured now.
 */
export class SandboxMetricsReader {
  private readonly last = new Map<string, { cpuNs: number; atMs: number }>();

  constructor(
    private readonly ctx: Pick<RuntimeContext, 'cgroups' | 'cgroupRel'>,
    private readonly execRaw: (id: string, spec: RuntimeRawExecSpec) => Promise<RuntimeRawExecOutcome>,
  ) {}

  async read(id: string): Promise<RuntimeMetrics> {
    const cg = await this.ctx.cgroups();
    if (!cg.cpuacct) throw new RollboxError('internal', 'the cpuacct cgroup controller is not mounted on this host: no CPU figures');
    const rel = this.ctx.cgroupRel(id);
    const cpuFile = path.join(cg.cpuacct, rel, 'cpuacct.usage');
    const cpuNow = async () => ({ cpuNs: await readNumber(cpuFile), atMs: performance.now() });
    let start = this.last.get(id);
    let end = await cpuNow().catch(() => {
      throw new RollboxError('invalid_state', `sandbox ${id} has no cgroup on this host (it is not running here)`);
    });
    if (!start || end.atMs - start.atMs > MAX_WINDOW_MS || end.atMs - start.atMs < MIN_WINDOW_MS) {
      start = end;
      await sleep(MIN_WINDOW_MS);
      end = await cpuNow();
    }
    this.remember(id, end);
    const memoryDir = path.join(cg.memory, rel);
    const [usage, stat, disk] = await Promise.all([readNumber(path.join(memoryDir, 'memory.usage_in_bytes')), readFile(path.join(memoryDir, 'memory.stat'), 'utf8'), this.disk(id)]);
    const cache = Number(/^total_cache (\d+)$/m.exec(stat)?.[1] ?? /^cache (\d+)$/m.exec(stat)?.[1] ?? 0);
    return {
      atMs: Date.now(),
      cpuUsedMs: (end.cpuNs - start.cpuNs) / 1e6,
      windowMs: end.atMs - start.atMs,
      memoryUsedBytes: Math.max(0, usage - cache),
      memoryCacheBytes: cache,
      diskUsedBytes: (disk.blocks - disk.bfree) * disk.bsize,
      diskTotalBytes: disk.blocks * disk.bsize,
    };
  }

  private async disk(id: string): Promise<{ blocks: number; bfree: number; bsize: number }> {
    const run = await this.execRaw(id, { argv: [SANDBOX_BUSYBOX, 'stat', '-f', '-c', '%b %f %S', '/'], timeoutMs: 10_000, maxStdoutBytes: 256 });
    const [blocks, bfree, bsize] = run.stdout.toString().trim().split(' ').map(Number);
    if (run.exitCode !== 0 || !Number.isFinite(blocks) || !Number.isFinite(bfree) || !bsize) throw new RollboxError('internal', `statfs in sandbox ${id} failed: ${run.stderr.trim() || `exit ${run.exitCode}`}`);
    return { blocks: blocks!, bfree: bfree!, bsize };
  }

  private remember(id: string, reading: { cpuNs: number; atMs: number }): void {
    this.last.delete(id);
    this.last.set(id, reading);
    // Oldest first (insertion order): a host asked about many sandboxes forgets the stalest.
    if (this.last.size > MAX_READINGS) this.last.delete(this.last.keys().next().value!);
  }
}
