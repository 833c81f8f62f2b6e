import { mkdirSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { RollboxError } from '../../api/index.ts';
import { killCgroup, migrateProcs, readProcs, removeCgroupTree } from './cgroups.ts';

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
 * The exec cgroups of one sandbox. Every command joins one (pids, freezer and memory)
 * itself, after fork and before exec (see rollbox-init.c), so:
 * - a timeout kills its whole tree, `setsid` and double forks included (the freezer stops
 *   a fork race while the pids listing is killed);
 * - an OOM kill is counted in the victim's own memory cgroup (cgroup v1 does not pass the
 *   count up), so only the command that suffered it is told.
 *
 * Slots are reused, not made per command: a removed memory cgroup that still has page
 * cache charged lingers in the kernel, and the kernel allows 65,535 memory cgroups in all.
 * A slot goes back to the free list only once it is empty; what a command left running
 * (a daemon) moves to the sandbox's own cgroup first.
 */
export class ExecSlots {
  private readonly free: string[] = [];
  /** Released with processes still in them (a fork during the move): re-checked before reuse. */
  private readonly unsettled = new Set<string>();
  private next = 0;

  constructor(private readonly sandbox: SandboxCgroupDirs) {}

  private slot(name: string): ExecSlot {
    return { name, pids: path.join(this.sandbox.pids, name), freezer: path.join(this.sandbox.freezer, name), memory: path.join(this.sandbox.memory, name) };
  }

  acquire(): ExecSlot {
    for (const name of this.unsettled) {
      if (this.settle(this.slot(name))) {
        this.unsettled.delete(name);
        this.free.push(name);
      }
    }
    const reused = this.free.pop();
    if (reused) return this.slot(reused);
    const slot = this.slot(`s${this.next++}`);
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
    return slot;
  }

  /** After the command ended: kill what is left (timeout, overflow) or move it to the sandbox. */
  async release(slot: ExecSlot, options: { kill: boolean }): Promise<void> {
    if (options.kill) await killCgroup(slot.pids, slot.freezer);
    if (this.settle(slot)) this.free.push(slot.name);
    else this.unsettled.add(slot.name);
  }

  /** Moves leftovers to the sandbox's own cgroups; true when the slot is empty. */
  private settle(slot: ExecSlot): boolean {
    const busy = (): boolean => [slot.pids, slot.freezer, slot.memory].some((d) => readProcs(d).length > 0);
    if (!busy()) return true;
    migrateProcs(slot.pids, this.sandbox.pids);
    migrateProcs(slot.freezer, this.sandbox.freezer);
    migrateProcs(slot.memory, this.sandbox.memory);
    return !busy();
  }

  /**
   * After a worker restart: commands of the previous process are killed (nobody collects
   * their results), their slots reused; any other child cgroup is removed.
   */
  async adopt(): Promise<void> {
    const names = readdirSync(this.sandbox.pids, { withFileTypes: true }).filter((e) => e.isDirectory()).map((e) => e.name);
    for (const name of names) {
      const slot = this.slot(name);
      await killCgroup(slot.pids, slot.freezer);
      const n = SLOT_RE.exec(name);
      if (n) {
        this.next = Math.max(this.next, Number(n[1]) + 1);
        this.free.push(name);
      } else {
        for (const dir of [slot.pids, slot.freezer, slot.memory]) removeCgroupTree(dir);
      }
    }
  }
}
