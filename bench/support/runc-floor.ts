import fs from 'node:fs/promises';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { runTool } from '../../src/proc/index.ts';

/** A runc call that must succeed (the floor measures it; a failure is a broken bench). */
async function runc(args: string[], output: 'collect' | 'ignore' = 'collect'): Promise<void> {
  const r = await runTool('runc', args, { output });
  if (r.code !== 0) throw new Error(`runc ${args.join(' ')} exited ${r.code}: ${r.stderr.trim()}`);
}

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
export async function rawRuncRunFloor(opts: {
  workerDir: string;
  templateSandboxId: string;
  runs: number;
  concurrency?: number;
  onRun?: () => void;
  /** Each container deleted right after its start (`runc delete -f`), timed together: the floor of a one-shot sandbox. */
  deleteEach?: boolean;
}): Promise<{ samplesMs: number[]; wallMs: number }> {
  const template = sandboxPaths(opts.workerDir, opts.templateSandboxId);
  const config = JSON.parse(await fs.readFile(path.join(template.bundleDir, 'config.json'), 'utf8'));
  // The sandbox's overlay over the shared layer mounts is the first OCI mount; the floor
  // keeps it (same lower layers) and gives each run its own upper and work dirs.
  if (!config.mounts.some((m: { type: string }) => m.type === 'overlay')) throw new Error('template config has no overlay mount');
  const floorDir = path.join(opts.workerDir, 'bench-floor');
  const samples: number[] = [];
  await fs.rm(floorDir, { recursive: true, force: true });
  const started = performance.now();
  let next = 0;
  const runOne = async (i: number) => {
      const id = `rb-floor-${process.pid}-${i}`;
      const runDir = path.join(floorDir, String(i));
      for (const d of ['upper', 'work', 'rootfs']) await fs.mkdir(path.join(runDir, d), { recursive: true });
      const own = structuredClone(config);
      own.mounts = own.mounts.map((m: { type: string; options: string[] }) =>
        m.type !== 'overlay' ? m : { ...m, options: m.options.map((o) => (o.startsWith('upperdir=') ? `upperdir=${runDir}/upper` : o.startsWith('workdir=') ? `workdir=${runDir}/work` : o)) },
      );
      own.root.path = path.join(runDir, 'rootfs');
      // rollbox-init needs the socket and cgroup fds rollbox hands it; the floor's PID 1 just sleeps.
      own.process.args = ['/.rollbox/busybox', 'sleep', '2147483647'];
      own.linux.cgroupsPath = `/rollbox-bench/${id}`;
      await fs.writeFile(path.join(runDir, 'config.json'), JSON.stringify(own));
      // `runc run -d` hands its stdio to the container: collect nothing, or this waits for it.
      samples.push(
        await timed(async () => {
          await runc(['--root', template.runcRoot, 'run', '-d', '--bundle', runDir, id], 'ignore');
          if (opts.deleteEach) await runc(['--root', template.runcRoot, 'delete', '-f', id]);
        }),
      );
      opts.onRun?.();
      return id;
  };
  const ids: string[] = [];
  try {
    await Promise.all(
      Array.from({ length: opts.concurrency ?? 1 }, async () => {
        while (next < opts.runs) {
          const id = await runOne(next++);
          if (!opts.deleteEach) ids.push(id);
        }
      }),
    );
    return { samplesMs: samples, wallMs: performance.now() - started };
  } finally {
    for (const id of ids) await runc(['--root', template.runcRoot, 'delete', '-f', id]).catch(() => {});
    await fs.rm(floorDir, { recursive: true, force: true });
    await removeCgroups('/rollbox-bench');
  }
}

/** runc delete removes each container's cgroups but not the parent the floor made. */
async function removeCgroups(parent: string): Promise<void> {
  for (const controller of await fs.readdir('/sys/fs/cgroup')) {
    await fs.rmdir(path.join('/sys/fs/cgroup', controller, parent)).catch(() => {});
  }
}

/** The floor for exec: raw `runc exec` of the same argv in the same container. */
export async function rawRuncExecFloor(opts: { workerDir: string; sandboxId: string; argv: string[]; runs: number; onRun?: () => void }): Promise<number[]> {
  const { runcRoot, containerId } = sandboxPaths(opts.workerDir, opts.sandboxId);
  const samples: number[] = [];
  for (let i = 0; i < opts.runs; i++) {
    samples.push(await timed(() => runc(['--root', runcRoot, 'exec', containerId, ...opts.argv])));
    opts.onRun?.();
  }
  return samples;
}
