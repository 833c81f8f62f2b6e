import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { RollboxError } from '../../api/index.ts';
import { mkfsErofs } from '../../layers/index.ts';
import { runTool } from '../../proc/index.ts';
import { PackStage } from './pack-stage.ts';
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
 * That moment costs the sandbox as little frozen time as we can make it: frozen only
 * while a hard-link copy of the upper dir is made (PackStage: milliseconds, no data
 * moved), thawed while mkfs reads the copy. If a linked file changed meanwhile, or the
 * copy cannot be made (disk full), the image is built again from the upper dir frozen
 * throughout. A paused sandbox is packed directly (it is frozen already and stays so).
 * `frozenMs`: how long this call kept the sandbox frozen.
 */
export async function packUpperDir(options: PackOptions): Promise<{ frozenMs: number }> {
  const wasFrozen = (await readFile(options.freezerStateFile, 'utf8')).trim() === 'FROZEN';
  if (wasFrozen) {
    await mkfs(options.upperDir, options);
    return { frozenMs: 0 };
  }
  const stage = new PackStage(options.upperDir, path.join(path.dirname(options.upperDir), `pack-${process.pid}-${Date.now()}-${Math.random().toString(36).slice(2, 8)}`));
  let frozenMs = 0;
  try {
    // Written-back first, while the sandbox runs: ext4 (data=ordered) makes the links' journal
    // commit wait for the disk's dirty data, which would otherwise happen during the freeze.
    await runTool('sync', ['--file-system', options.upperDir]);
    const staged = await frozen(options.freezerStateFile, () => {
      try {
        stage.build(Date.now());
        return true;
      } catch {
        return false; // out of space or inodes on the sandbox's disk: the slow path below
      }
    });
    frozenMs += staged.ms;
    if (staged.value && (await stage.copyXattrs())) {
      await mkfs(stage.dir, options);
      if (stage.unchanged()) return { frozenMs };
    }
  } finally {
    await stage.remove();
  }
  frozenMs += (await frozen(options.freezerStateFile, () => mkfs(options.upperDir, options))).ms;
  return { frozenMs };
}

/** `fn` with the sandbox frozen, and how long it was (from the freeze asked to the thaw done). */
async function frozen<T>(freezerStateFile: string, fn: () => T | Promise<T>): Promise<{ value: T; ms: number }> {
  const frozenAt = performance.now();
  await setFreezerState(freezerStateFile, 'FROZEN');
  let value: T;
  try {
    value = await fn();
  } finally {
    await setFreezerState(freezerStateFile, 'THAWED');
  }
  return { value, ms: performance.now() - frozenAt };
}

function mkfs(srcDir: string, options: PackOptions): Promise<void> {
  return packDir(srcDir, options.outPath, options.excludePaths);
}

/** An upper dir (or a copy of one) as an EROFS image, overlay xattrs kept, without `excludePaths` (absolute, inside the sandbox). */
export function packDir(srcDir: string, outPath: string, excludePaths: readonly string[]): Promise<void> {
  return mkfsErofs(srcDir, outPath, {
    keepXattrs: true,
    excludePaths: excludePaths.map((p) => p.replace(/^\/+/, '').replace(/\/+$/, '')).filter(Boolean),
  });
}
