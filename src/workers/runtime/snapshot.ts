import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { RollboxError } from '../../api/index.ts';
import { mkfsErofs } from '../../layers/index.ts';
import { setFreezerState } from './cgroups.ts';

/** The overlay upper dir a bundle's config.json gives runc: the one source of truth for where writes land. */
export async function upperDirOfBundle(bundleDir: string): Promise<string> {
  const config = JSON.parse(await readFile(path.join(bundleDir, 'config.json'), 'utf8')) as { mounts?: { type?: string; options?: string[] }[] };
  const overlay = config.mounts?.find((m) => m.type === 'overlay');
  const upper = overlay?.options?.find((o) => o.startsWith('upperdir='))?.slice('upperdir='.length);
  if (!upper) throw new RollboxError('internal', `${bundleDir}: no overlay upper dir in config.json`);
  return upper;
}

/**
 * pack_diff: the upper dir as an EROFS image. Whiteouts (0:0 char devices) and opaque
 * directories (`trusted.overlay.opaque`) are kept, so the image stacked over the same
 * layers shows exactly the sandbox's files. The sandbox is frozen while mkfs reads the
 * upper dir, so the image is one consistent moment (and thawed only if it was running).
 */
export async function packUpperDir(options: { upperDir: string; outPath: string; excludePaths: readonly string[]; freezerStateFile: string }): Promise<{ frozenMs: number }> {
  const wasFrozen = (await readFile(options.freezerStateFile, 'utf8')).trim() === 'FROZEN';
  const frozenAt = performance.now();
  if (!wasFrozen) await setFreezerState(options.freezerStateFile, 'FROZEN');
  try {
    await mkfsErofs(options.upperDir, options.outPath, {
      keepXattrs: true,
      excludePaths: options.excludePaths.map((p) => p.replace(/^\/+/, '').replace(/\/+$/, '')).filter(Boolean),
    });
  } finally {
    if (!wasFrozen) await setFreezerState(options.freezerStateFile, 'THAWED');
  }
  // From the freeze asked to the thaw done: what the sandbox's processes lost (0: it was paused already).
  return { frozenMs: wasFrozen ? 0 : performance.now() - frozenAt };
}
