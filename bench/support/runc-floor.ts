import { execFile } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { promisify } from 'node:util';

const run = promisify(execFile);

/** Where the runc runtime keeps a sandbox on a worker host (see src/workers/runtime). */
export function sandboxPaths(workerDir: string, sandboxId: string) {
  return { runcRoot: path.join(workerDir, 'runc'), containerId: `rb-${sandboxId}`, bundleDir: path.join(workerDir, 'sandboxes', sandboxId) };
}

export async function timed(fn: () => Promise<unknown>): Promise<number> {
  const started = performance.now();
  await fn();
  return performance.now() - started;
}

/**
 * The floor for create: raw `runc run -d` with the very config.json rollbox wrote for a
 * sandbox, on an overlayfs over the same mounted EROFS layer, without rollbox in the path.
 */
export async function rawRuncRunFloor(opts: { workerDir: string; templateSandboxId: string; runs: number; onRun?: () => void }): Promise<number[]> {
  const template = sandboxPaths(opts.workerDir, opts.templateSandboxId);
  const config = JSON.parse(await fs.readFile(path.join(template.bundleDir, 'config.json'), 'utf8'));
  const overlay = (await fs.readFile('/proc/mounts', 'utf8')).split('\n').find((l) => l.includes(` ${path.join(template.bundleDir, 'rootfs')} overlay `));
  const lowerdir = /lowerdir=([^,]+)/.exec(overlay ?? '')?.[1];
  if (!lowerdir) throw new Error('cannot find the template sandbox overlay mount');
  const floorDir = path.join(opts.workerDir, 'bench-floor');
  const samples: number[] = [];
  await fs.rm(floorDir, { recursive: true, force: true });
  for (const d of ['upper', 'work', 'rootfs']) await fs.mkdir(path.join(floorDir, d), { recursive: true });
  await run('mount', ['-t', 'overlay', 'overlay', '-o', `lowerdir=${lowerdir},upperdir=${floorDir}/upper,workdir=${floorDir}/work`, `${floorDir}/rootfs`]);
  try {
    for (let i = 0; i < opts.runs; i++) {
      const id = `rb-floor-${process.pid}-${i}`;
      config.root.path = path.join(floorDir, 'rootfs');
      config.linux.cgroupsPath = `/rollbox-bench/${id}`;
      await fs.writeFile(path.join(floorDir, 'config.json'), JSON.stringify(config));
      samples.push(await timed(() => run('runc', ['--root', template.runcRoot, 'run', '-d', '--bundle', floorDir, id], { timeout: 30_000 })));
      await run('runc', ['--root', template.runcRoot, 'delete', '-f', id]);
      opts.onRun?.();
    }
  } finally {
    await run('umount', [`${floorDir}/rootfs`]).catch(() => {});
    await fs.rm(floorDir, { recursive: true, force: true });
  }
  return samples;
}

/** The floor for exec: raw `runc exec` of the same argv in the same container. */
export async function rawRuncExecFloor(opts: { workerDir: string; sandboxId: string; argv: string[]; runs: number; onRun?: () => void }): Promise<number[]> {
  const { runcRoot, containerId } = sandboxPaths(opts.workerDir, opts.sandboxId);
  const samples: number[] = [];
  for (let i = 0; i < opts.runs; i++) {
    samples.push(await timed(() => run('runc', ['--root', runcRoot, 'exec', containerId, ...opts.argv], { timeout: 30_000 })));
    opts.onRun?.();
  }
  return samples;
}
