import { existsSync, readFileSync, readdirSync, rmdirSync, writeFileSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { RollboxError } from '../../api/index.ts';
import { readMountInfo } from '../../layers/index.ts';

/**
 * The cgroup hierarchies of this host as runc sees them: one directory per v1 controller
 * (or named hierarchy) plus the v2 mount of a hybrid host. runc creates a container's
 * cgroup at the same relative path in every one of them.
 */
export interface CgroupHierarchies {
  /** Every hierarchy's mount point (v1 controllers, named v1, unified). */
  all: string[];
  memory: string;
  pids: string;
  freezer: string;
  /** The v1 cpu controller, if mounted (for cpu.idle of besteffort sandboxes). */
  cpu?: string;
  /** The v1 cpuacct controller, if mounted (a sandbox's CPU time, for its metrics). */
  cpuacct?: string;
  /** memory.memsw.* exists (swap accounting on): only then can swap be limited. */
  memsw: boolean;
}

export async function discoverCgroups(): Promise<CgroupHierarchies> {
  const mounts = (await readMountInfo()).filter((m) => (m.fsType === 'cgroup' || m.fsType === 'cgroup2') && m.root === '/');
  const byController = new Map<string, string>();
  for (const m of mounts) {
    if (m.fsType !== 'cgroup') continue;
    for (const opt of m.superOptions.split(',')) byController.set(opt, m.mountPoint);
  }
  const need = (c: string): string => {
    const dir = byController.get(c);
    if (!dir) throw new Error(`cgroup v1 controller ${c} is not mounted; the runc runtime needs cgroups v1 (hybrid is fine)`);
    return dir;
  };
  const memory = need('memory');
  return {
    all: [...new Set(mounts.map((m) => m.mountPoint))],
    memory,
    pids: need('pids'),
    cpu: byController.get('cpu'),
    cpuacct: byController.get('cpuacct'),
    freezer: need('freezer'),
    memsw: existsSync(path.join(memory, 'memory.memsw.limit_in_bytes')),
  };
}

/** The oom_kill counter of a v1 memory cgroup (0 when the cgroup is gone). */
export function readOomKills(memoryCgroupDir: string): number {
  try {
    const text = readFileSync(path.join(memoryCgroupDir, 'memory.oom_control'), 'utf8');
    const m = /^oom_kill (\d+)$/m.exec(text);
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

export function readProcs(cgroupDir: string): number[] {
  try {
    return readFileSync(path.join(cgroupDir, 'cgroup.procs'), 'utf8')
      .split('\n')
      .filter((l) => l !== '')
      .map(Number);
  } catch {
    return [];
  }
}

export function killQuietly(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // already gone
  }
}

/** Best effort: the cgroup may be gone already. */
export function writeFreezer(freezerDir: string | undefined, state: 'FROZEN' | 'THAWED'): void {
  if (!freezerDir) return;
  try {
    writeFileSync(path.join(freezerDir, 'freezer.state'), state);
  } catch {
    // the cgroup may be gone already
  }
}

/**
 * SIGKILL every process in a cgroup until it is empty. With a freezer cgroup covering the
 * same processes we freeze first, so nothing can fork between reading the list and
 * killing it (a fork bomb cannot outrun us); SIGKILL is delivered to frozen tasks once
 * thawed. Returns whether the cgroup emptied within `budgetMs`.
 */
export async function killCgroup(procsDir: string, freezerDir: string | undefined, budgetMs = 2000): Promise<boolean> {
  const deadline = Date.now() + budgetMs;
  for (let round = 0; ; round++) {
    let pids = readProcs(procsDir);
    if (pids.length === 0) return true;
    writeFreezer(freezerDir, 'FROZEN');
    pids = readProcs(procsDir);
    for (const pid of pids) killQuietly(pid);
    writeFreezer(freezerDir, 'THAWED');
    if (Date.now() > deadline) return readProcs(procsDir).length === 0;
    await sleep(round < 5 ? 2 : 10);
  }
}

/**
 * rmdir a cgroup and its children, deepest first; reports whether it is gone. The rmdir
 * is tried first: a cgroup without children (most are) costs no directory listing.
 */
export function removeCgroupTree(dir: string): boolean {
  try {
    rmdirSync(dir);
    return true;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return true;
    if (code !== 'EBUSY' && code !== 'ENOTEMPTY') return false;
  }
  let ok = true;
  for (const child of childCgroups(dir)) ok = removeCgroupTree(path.join(dir, child)) && ok;
  try {
    rmdirSync(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') ok = false;
  }
  return ok;
}

/**
 * Kill every process of one sandbox and remove its cgroup trees (`dirs`, one per
 * hierarchy). Its processes are listed from `procsDir`'s tree alone (every process is in
 * every hierarchy, so one tree has them all). The first round kills without freezing:
 * they all live in the sandbox's pid namespace, and when its init dies the kernel kills
 * the rest and lets nothing fork in it any more. Should anything survive, later rounds
 * freeze `freezerDir` around the kill (v1 freezing is hierarchical).
 */
export async function destroyCgroupTrees(dirs: readonly string[], procsDir: string, freezerDir: string | undefined): Promise<boolean> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const busy = walk(procsDir).filter((d) => readProcs(d).length > 0);
    if (busy.length > 0) {
      if (attempt > 0) writeFreezer(freezerDir, 'FROZEN');
      for (const d of busy) for (const pid of readProcs(d)) killQuietly(pid);
      if (attempt > 0) writeFreezer(freezerDir, 'THAWED');
      await sleep(attempt < 5 ? 2 : 10);
      continue;
    }
    let allGone = true;
    for (const dir of dirs) allGone = removeCgroupTree(dir) && allGone;
    if (allGone) return true;
    await sleep(10);
  }
  return false;
}

function childCgroups(dir: string): string[] {
  try {
    return readdirSync(dir, { withFileTypes: true })
      .filter((d) => d.isDirectory())
      .map((d) => d.name);
  } catch {
    return [];
  }
}

/** Processes of a cgroup and of every cgroup under it. */
export function procsOfTree(dir: string): number[] {
  return walk(dir).flatMap(readProcs);
}

function walk(dir: string): string[] {
  return [...childCgroups(dir).flatMap((child) => walk(path.join(dir, child))), dir];
}

/** How often a freeze still FREEZING is asked again: the kernel retries the tasks it could not stop yet (busy in the kernel, in I/O) only when told again. */
const FREEZE_REWRITE_MS = 50;

/**
 * Sets a v1 freezer cgroup to FROZEN or THAWED and waits until it is there: freezing is
 * asynchronous (the state reads FREEZING until every task has stopped). A freeze that does
 * not complete in time (a host so busy that a task cannot be stopped) is undone, so the
 * sandbox runs on as it was, and answered `unavailable` with a Retry-After: never a
 * sandbox left half frozen, never a 500.
 */
export async function setFreezerState(stateFile: string, target: 'FROZEN' | 'THAWED', timeoutMs = 5000): Promise<void> {
  await writeFile(stateFile, target);
  let rewrittenAt = Date.now();
  for (const deadline = Date.now() + timeoutMs; (await readFile(stateFile, 'utf8')).trim() !== target; await sleep(1)) {
    if (Date.now() > deadline) {
      if (target === 'THAWED') throw new RollboxError('internal', `${stateFile} did not reach THAWED within ${timeoutMs} ms`);
      await setFreezerState(stateFile, 'THAWED', timeoutMs);
      throw new RollboxError('unavailable', `the sandbox's processes could not all be stopped within ${timeoutMs} ms (the host is busy); it runs on as it was: pause it again`, 2);
    }
    if (target === 'FROZEN' && Date.now() - rewrittenAt >= FREEZE_REWRITE_MS) {
      await writeFile(stateFile, target);
      rewrittenAt = Date.now();
    }
  }
}
