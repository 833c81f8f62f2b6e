import { lstatSync, readdirSync } from 'node:fs';
import { readFile, rm } from 'node:fs/promises';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { RollboxError } from '../../api/index.ts';
import { mkfsErofs } from '../../layers/index.ts';
import { runTool } from '../../proc/index.ts';
import { setFreezerState } from './cgroups.ts';

/** The overlay upper dir a bundle's config.json gives runc: the one source of truth for where writes land. */
export async function upperDirOfBundle(bundleDir: string): Promise<string> {
  const config = JSON.parse(await readFile(path.join(bundleDir, 'config.json'), 'utf8')) as { mounts?: { type?: string; options?: string[] }[] };
  const overlay = config.mounts?.find((m) => m.type === 'overlay');
  const upper = overlay?.options?.find((o) => o.startsWith('upperdir='))?.slice('upperdir='.length);
  if (!upper) throw new RollboxError('internal', `${bundleDir}: no overlay upper dir in config.json`);
  return upper;
}

interface PackOptions {
  upperDir: string;
  outPath: string;
  excludePaths: readonly string[];
  freezerStateFile: string;
}

/**
 * pack_diff: the upper dir as an EROFS image. Whiteouts (0:0 char devices) and opaque
 * directories (`trusted.overlay.opaque`) are kept, so the image stacked over the same
 * layers shows exactly the sandbox's files, as of one moment.
 *
 * That moment costs the sandbox as little frozen time as we can make it: frozen, the
 * upper dir is copied as hard links (new directories, the same file inodes: ~20 ms for
 * 1,000 files, no data copied) and every file's ctime noted; thawed, mkfs reads the links
 * at leisure. A file the sandbox changes afterwards changes under the links too, but the
 * kernel then moves its ctime (ext4's multigrain timestamps make that move visible even
 * within one clock tick, since its ctime was just read), so after mkfs every file is
 * checked: any change, or a staging copy that cannot be made (disk full), and the image
 * is built again from the upper dir frozen throughout, as before. A paused sandbox is
 * packed directly (it is frozen already and stays so).
 */
export async function packUpperDir(options: PackOptions): Promise<{ frozenMs: number }> {
  const wasFrozen = (await readFile(options.freezerStateFile, 'utf8')).trim() === 'FROZEN';
  if (wasFrozen) {
    await mkfs(options.upperDir, options);
    return { frozenMs: 0 };
  }
  const staged = await stageUnderFreeze(options);
  if (staged) {
    try {
      await mkfs(staged.dir, options);
      if (unchangedSince(staged.dir, staged.ctimes)) return { frozenMs: staged.frozenMs };
    } finally {
      await rm(staged.dir, { recursive: true, force: true });
    }
  }
  const frozenAt = performance.now();
  await setFreezerState(options.freezerStateFile, 'FROZEN');
  try {
    await mkfs(options.upperDir, options);
  } finally {
    await setFreezerState(options.freezerStateFile, 'THAWED');
  }
  return { frozenMs: (staged?.frozenMs ?? 0) + performance.now() - frozenAt };
}

function mkfs(srcDir: string, options: PackOptions): Promise<void> {
  return mkfsErofs(srcDir, options.outPath, {
    keepXattrs: true,
    excludePaths: options.excludePaths.map((p) => p.replace(/^\/+/, '').replace(/\/+$/, '')).filter(Boolean),
  });
}

/**
 * A hard-link copy of the upper dir beside it (same filesystem: the sandbox's disk), made
 * while the sandbox is frozen, with each non-directory's ctime. Undefined if it could not
 * be made (its leftovers removed).
 */
async function stageUnderFreeze(options: PackOptions): Promise<{ dir: string; ctimes: Map<string, bigint>; frozenMs: number } | undefined> {
  const dir = path.join(path.dirname(options.upperDir), `pack-${process.pid}-${Date.now()}-${Math.random().toString(36).slice(2, 8)}`);
  const frozenAt = performance.now();
  await setFreezerState(options.freezerStateFile, 'FROZEN');
  let ctimes: Map<string, bigint> | undefined;
  try {
    // `cp -a` keeps directories' xattrs (the opaque marks) and links files, whiteouts included.
    const copied = await runTool('cp', ['-al', '--', options.upperDir, dir]);
    if (copied.code === 0) ctimes = await copyHotFiles(options.upperDir, dir, ctimesOf(dir));
  } finally {
    await setFreezerState(options.freezerStateFile, 'THAWED');
  }
  const frozenMs = performance.now() - frozenAt;
  if (!ctimes) {
    await rm(dir, { recursive: true, force: true });
    return undefined;
  }
  return { dir, ctimes, frozenMs };
}

/** Files written this recently are likely written again while mkfs reads: copied, not linked. */
const HOT_WITHIN_MS = 2000;
/** At most this much is copied while frozen (newest first); the rest is linked, and checked. */
const HOT_COPY_BUDGET_BYTES = 4 * 1024 * 1024;
const HOT_COPY_MAX_FILES = 256;

/**
 * A log the sandbox appends to every 100 ms would otherwise change under its link during
 * every pack, and send every fork of it down the slow path. Returns the ctimes of the
 * files still linked.
 */
async function copyHotFiles(upperDir: string, dir: string, ctimes: Map<string, bigint>): Promise<Map<string, bigint> | undefined> {
  const sinceNs = BigInt(Date.now() - HOT_WITHIN_MS) * 1_000_000n;
  const hot = [...ctimes.keys()]
    .map((file) => ({ file, stat: lstatSync(file, { bigint: true }) }))
    .filter(({ stat }) => stat.isFile() && stat.mtimeNs > sinceNs)
    .sort((a, b) => (a.stat.mtimeNs > b.stat.mtimeNs ? -1 : 1));
  const chosen: string[] = [];
  let budget = BigInt(HOT_COPY_BUDGET_BYTES);
  for (const { file, stat } of hot) {
    if (chosen.length >= HOT_COPY_MAX_FILES) break;
    if (stat.size > budget) continue;
    budget -= stat.size;
    chosen.push(path.relative(dir, file));
  }
  if (!chosen.length) return ctimes;
  // From the upper dir, attributes and all; the link is removed first, so the sandbox's file is not touched.
  const copied = await runTool('cp', ['-a', '--parents', '--remove-destination', '--', ...chosen, dir], { cwd: upperDir });
  if (copied.code !== 0) return undefined;
  for (const rel of chosen) ctimes.delete(path.join(dir, rel));
  return ctimes;
}

/** Synchronous: thousands of lstat calls take a few ms, far less than as many thread-pool round trips. */
function ctimesOf(dir: string): Map<string, bigint> {
  const ctimes = new Map<string, bigint>();
  for (const entry of readdirSync(dir, { recursive: true, withFileTypes: true })) {
    if (entry.isDirectory()) continue;
    const file = path.join(entry.parentPath, entry.name);
    ctimes.set(file, lstatSync(file, { bigint: true }).ctimeNs);
  }
  return ctimes;
}

/** Only this code writes into the staging copy: a linked file is as it was if its ctime is. */
function unchangedSince(dir: string, ctimes: Map<string, bigint>): boolean {
  const now = ctimesOf(dir);
  return [...ctimes].every(([file, ctime]) => now.get(file) === ctime);
}
