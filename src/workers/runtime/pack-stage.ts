import { chmodSync, chownSync, constants, copyFileSync, linkSync, lstatSync, mkdirSync, readdirSync, unlinkSync, utimesSync, type BigIntStats } from 'node:fs';
import { rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { runTool } from '../../proc/index.ts';

/** Files written this recently are likely written again while mkfs reads: copied, not linked. */
const HOT_WITHIN_MS = 2000;
/** At most this much is copied while frozen (newest first); the rest is linked, and checked. */
const HOT_COPY_BUDGET_BYTES = 1024 * 1024;
const HOT_COPY_MAX_FILES = 256;
/** getfattr takes paths in batches of this many. */
const XATTR_BATCH = 500;

/**
 * A copy of an upper dir as of one moment, made in milliseconds while the sandbox is
 * frozen: its directories made anew (mode, owner and times as they were), its other
 * entries (files, whiteouts, symlinks) hard-linked, so no data moves, except files
 * written in the last moments, which are copied outright (within a budget): a log the
 * sandbox appends to would otherwise change under its link. `linked` holds each linked
 * inode's ctime: a file the sandbox changes later changes under its link too, and the
 * kernel then moves its ctime (ext4's multigrain timestamps make the move visible even
 * within one clock tick, since the ctime was just read), so `unchanged` tells whether the
 * copy still is that moment.
 */
export class PackStage {
  readonly linked = new Map<string, bigint>();
  /** Directories and copied files (relative), whose extended attributes are copied after the thaw. */
  private readonly withOwnInode: { rel: string; ino: bigint; dir: boolean }[] = [];

  constructor(
    readonly upperDir: string,
    readonly dir: string,
  ) {}

  /** Under the freeze: synchronous on purpose (each call takes microseconds; a thread-pool round trip ~0.3 ms). */
  build(nowMs: number): void {
    const dirs: { rel: string; stat: BigIntStats }[] = [];
    const hot: { rel: string; stat: BigIntStats }[] = [];
    const walk = (rel: string, stat: BigIntStats): void => {
      mkdirSync(path.join(this.dir, rel), { mode: 0o700 });
      dirs.push({ rel, stat });
      for (const entry of readdirSync(path.join(this.upperDir, rel), { withFileTypes: true })) {
        const child = path.join(rel, entry.name);
        if (entry.isDirectory()) {
          walk(child, lstatSync(path.join(this.upperDir, child), { bigint: true }));
          continue;
        }
        linkSync(path.join(this.upperDir, child), path.join(this.dir, child));
        // Read after the link, which itself moves the ctime (the link count changed).
        const childStat = lstatSync(path.join(this.dir, child), { bigint: true });
        this.linked.set(child, childStat.ctimeNs);
        if (childStat.isFile() && childStat.mtimeNs > BigInt(nowMs - HOT_WITHIN_MS) * 1_000_000n) hot.push({ rel: child, stat: childStat });
      }
    };
    walk('', lstatSync(this.upperDir, { bigint: true }));
    let budget = BigInt(HOT_COPY_BUDGET_BYTES);
    for (const { rel, stat } of hot.sort((a, b) => (a.stat.mtimeNs > b.stat.mtimeNs ? -1 : 1)).slice(0, HOT_COPY_MAX_FILES)) {
      if (stat.size > budget) continue;
      budget -= stat.size;
      const staged = path.join(this.dir, rel);
      unlinkSync(staged); // the link, not the sandbox's file
      copyFileSync(path.join(this.upperDir, rel), staged, constants.COPYFILE_EXCL);
      setAttributes(staged, stat);
      this.linked.delete(rel);
      this.withOwnInode.push({ rel, ino: stat.ino, dir: false });
    }
    // Deepest first: making entries in a directory moves its times.
    for (const { rel, stat } of dirs.reverse()) {
      setAttributes(path.join(this.dir, rel), stat);
      this.withOwnInode.push({ rel, ino: stat.ino, dir: true });
    }
  }

  /**
   * After the thaw: extended attributes (overlayfs's opaque marks on directories above
   * all) copied onto the new inodes. A directory replaced since the freeze (another inode
   * at its path) would lend the wrong ones: false then.
   */
  async copyXattrs(): Promise<boolean> {
    const dumpFile = `${this.dir}.xattrs`;
    try {
      for (let i = 0; i < this.withOwnInode.length; i += XATTR_BATCH) {
        const batch = this.withOwnInode.slice(i, i + XATTR_BATCH);
        const dumped = await runTool('getfattr', ['--absolute-names', '-P', '-d', '-m', '-', '-e', 'hex', '--', ...batch.map((e) => path.join(this.upperDir, e.rel))]);
        if (dumped.code !== 0) return false;
        if (!batch.every((e) => sameInode(path.join(this.upperDir, e.rel), e.ino))) return false;
        const dump = dumped.stdout.split('\n').map((line) => (line.startsWith('# file: ') ? `# file: ${this.dir}${line.slice('# file: '.length + this.upperDir.length)}` : line));
        if (!dump.some((line) => line.startsWith('# file: '))) continue;
        await writeFile(dumpFile, `${dump.join('\n')}\n`);
        if ((await runTool('setfattr', ['-h', `--restore=${dumpFile}`])).code !== 0) return false;
      }
      return true;
    } finally {
      await rm(dumpFile, { force: true });
    }
  }

  /** Whether every linked file is as it was at the freeze. */
  unchanged(): boolean {
    for (const [rel, ctime] of this.linked) {
      const now = lstatSync(path.join(this.dir, rel), { bigint: true, throwIfNoEntry: false });
      if (now?.ctimeNs !== ctime) return false;
    }
    return true;
  }

  async remove(): Promise<void> {
    await rm(this.dir, { recursive: true, force: true });
  }
}

function setAttributes(file: string, stat: BigIntStats): void {
  chownSync(file, Number(stat.uid), Number(stat.gid));
  chmodSync(file, Number(stat.mode & 0o7777n));
  // Seconds as a double: sub-microsecond precision at today's epoch.
  utimesSync(file, Number(stat.atimeNs) / 1e9, Number(stat.mtimeNs) / 1e9);
}

function sameInode(file: string, ino: bigint): boolean {
  return lstatSync(file, { bigint: true, throwIfNoEntry: false })?.ino === ino;
}
