import { existsSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import path from 'node:path';
import { RollboxError } from '../../api/index.ts';
import { isMountPoint, unmount } from '../../layers/index.ts';
import { destroyCgroupTrees } from './cgroups.ts';
import type { RuntimeContext, SandboxRecord } from './context.ts';
import { runTool } from '../../proc/index.ts';
import { mountDiskOnHost } from './disk-on-host.ts';

export async function unmountRootfs(ctx: RuntimeContext, rootfs: string): Promise<void> {
  await unmount(rootfs, { umountBinary: ctx.umountBin, lazyFallback: true, onLazy: (stderr) => ctx.log?.warn({ rootfs, stderr }, 'overlay still busy; detaching lazily') });
}

/**
 * Stop a container without runc: `runc delete --force` polls in 100 ms sleeps after its
 * SIGKILL, which would dominate destroy. We do what it does: SIGKILL every process in its
 * cgroups (the init among them), wait until they are empty, and remove them (exec slots
 * included).
 */
async function killContainer(ctx: RuntimeContext, id: string): Promise<boolean> {
  const cg = await ctx.cgroups();
  const destroy = (rel: string) => destroyCgroupTrees(cg.all.map((h) => path.join(h, rel)), path.join(cg.pids, rel), path.join(cg.freezer, rel));
  const known = ctx.sandboxes.get(id);
  const rel = ctx.layout.cgroupRelOf(id, known?.besteffort ?? false);
  // A leftover's class is unknown: its cgroups may be in either tree.
  const other = ctx.layout.cgroupRelOf(id, !(known?.besteffort ?? false));
  if (!known && cg.all.some((h) => existsSync(path.join(h, other)))) await destroy(other);
  return destroy(rel);
}

/**
 * Remove everything of one sandbox: processes, cgroups, runc state, the init's socket,
 * layer references (only those this process holds, i.e. `rec.layers`), disk, bundle.
 * Every step tolerates "already gone", so destroy is idempotent and also cleans
 * half-created sandboxes.
 */
export async function teardown(ctx: RuntimeContext, id: string, rec: SandboxRecord | undefined): Promise<void> {
  const { layout } = ctx;
  const bundle = layout.bundleOf(id);
  // This death is ours: not one to report.
  ctx.initWatch.unwatch(id);
  ctx.forgetInit(id);
  // The host holds the disk again before the container dies: the overlay's reference
  // going must not be its last (that would write its dirty pages back, which can take
  // seconds; scratch.detach shuts the filesystem down instead).
  await mountDiskOnHost(ctx, id).catch((err: unknown) => ctx.log?.warn({ sandboxId: id, err: String(err) }, 'could not mount the disk on the host before the destroy'));
  if (!(await killContainer(ctx, id))) {
    // Something in the cgroup would not die (e.g. stuck in D state): let runc try.
    const [file, args] = ctx.runc(false, 'delete', '--force', layout.containerIdOf(id));
    const r = await runTool(file, args);
    if (r.code !== 0 && !/does not exist/.test(r.stderr)) ctx.log?.warn({ sandboxId: id, stderr: r.stderr.trim() }, 'runc delete failed');
    if (!(await killContainer(ctx, id))) ctx.log?.warn({ sandboxId: id }, 'cgroups of sandbox could not be removed');
  }
  // Its network namespace went with the processes; the host side (veth lease, chain, DNS) goes here.
  await ctx.network?.release(id);
  // With every process gone the container is stopped; its runc state is just files.
  await rm(path.dirname(layout.runcStateOf(id)), { recursive: true, force: true });
  await rm(layout.socketOf(id), { force: true });
  // The overlay lived in the container's mount namespace and went with it; a rootfs
  // mounted on the host is a leftover of an older layout or a crash, unmount it.
  const rootfs = path.join(bundle, 'rootfs');
  await unmountRootfs(ctx, rootfs);
  if (rec) {
    ctx.sandboxes.delete(id);
    const held = rec.layers;
    rec.layers = [];
    // A layer that will not unmount yet stays mounted with no references; the next
    // release or reconcile retries. It must not fail the destroy of this sandbox.
    await Promise.all(
      held.map((l) => ctx.layerMounts.release(l.digest).catch((err: unknown) => ctx.log?.warn({ sandboxId: id, digest: l.digest, err: String(err) }, 'layer release failed'))),
    );
  }
  // Its disk: unmounted here (the overlay, gone with the container, held the other
  // reference), so the loop device detaches itself; then the image is deleted.
  await ctx.scratch.detach(id, layout.diskOf(id));
  // Never rm -r through a live mount.
  if (isMountPoint(rootfs)) throw new RollboxError('internal', `${rootfs} is still mounted`);
  await rm(bundle, { recursive: true, force: true });
}
