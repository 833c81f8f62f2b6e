import { mkdirSync, readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { RollboxError } from '../../api/index.ts';
import { killCgroup } from './cgroups.ts';

/** A sandbox's own cgroup in the hierarchies its commands' exec cgroups live in. */
export interface SandboxCgroupDirs {
  pids: string;
  freezer: string;
  memory: string;
}

/** One exec cgroup: the same name under the sandbox's cgroup in each hierarchy. */
export interface ExecSlot extends SandboxCgroupDirs {
  name: string;
}

const SLOT_RE = /^s(\d+)$/;
/**
 * Past this many exec cgroups a sandbox's commands share the least busy one (with the
 * daemons there) rather than making more.
 */
const MAX_SLOTS = 32;

/**
 * The exec cgroups ("slots") of one sandbox. Every command runs in one (pids, freezer and
 * memory), born there from the slot's keeper (see rollbox-init.c), so:
 * - a timeout kills its whole tree, `setsid` and double forks included (the freezer stops
 *   a fork race while the pids listing is killed);
 * - an OOM kill is counted in the victim's own memory cgroup (cgroup v1 does not pass the
 *   count up), so only the command that suffered it is told.
 *
 * Slots are reused, not made per command: a removed memory cgroup that still has page
 * cache charged lingers in the kernel, which allows 65,535 memory cgroups in all. Nothing
 * is moved out of a slot (a move waits for an RCU grace period): a slot whose command left
 * a daemon running keeps it, and is not handed out again while anything but its keeper
 * lives there.
 */
export class ExecSlots {
  private readonly names: string[] = [];
  private readonly inUse = new Set<string>();
  private next = 0;

  constructor(private readonly sandbox: SandboxCgroupDirs) {}

  private slot(name: string): ExecSlot {
    return { name, pids: path.join(this.sandbox.pids, name), freezer: path.join(this.sandbox.freezer, name), memory: path.join(this.sandbox.memory, name) };
  }

  /** Tasks in a slot (its keeper counts one). */
  private population(name: string): number {
    try {
      return Number(readFileSync(path.join(this.sandbox.pids, name, 'pids.current'), 'utf8'));
    } catch {
      return 0;
    }
  }

  acquire(): ExecSlot {
    const idle = this.names.filter((n) => !this.inUse.has(n));
    let name = idle.find((n) => this.population(n) <= 1);
    if (!name && this.names.length >= MAX_SLOTS && idle.length > 0) name = idle.sort((a, b) => this.population(a) - this.population(b))[0];
    if (!name) name = this.make();
    this.inUse.add(name);
    return this.slot(name);
  }

  /** The slot a durable command of a previous worker process runs in (attach): busy until released. */
  claim(name: string): ExecSlot | undefined {
    if (!this.names.includes(name)) return undefined;
    this.inUse.add(name);
    return this.slot(name);
  }

  private make(): string {
    const name = `s${this.next++}`;
    const slot = this.slot(name);
    for (const dir of [slot.pids, slot.freezer, slot.memory]) {
      try {
        mkdirSync(dir);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code === 'EEXIST') continue;
        if (code === 'ENOENT') throw new RollboxError('invalid_state', 'the sandbox is not running (its cgroup is gone)');
        throw new RollboxError('internal', `exec cgroup: ${(err as Error).message}`);
      }
    }
    this.names.push(name);
    return name;
  }

  /** After the command ended: everything in the slot is killed (timeout, overflow), or it stays as it is. */
  async release(slot: ExecSlot, options: { kill: boolean }): Promise<void> {
    try {
      if (options.kill) await killCgroup(slot.pids, slot.freezer);
    } finally {
      this.inUse.delete(slot.name);
    }
  }

  /**
   * After a worker restart: the slots are known again. What still runs in them stays:
   * durable commands of the previous process (the next one attaches to them; the init
   * ends those nobody collects) and daemons; the init killed the others when their
   * connection closed.
   */
  adopt(): void {
    for (const e of readdirSync(this.sandbox.pids, { withFileTypes: true })) {
      const n = e.isDirectory() ? SLOT_RE.exec(e.name) : null;
      if (!n || this.names.includes(e.name)) continue;
      this.names.push(e.name);
      this.next = Math.max(this.next, Number(n[1]) + 1);
    }
  }
}
