import { existsSync, writeFileSync } from 'node:fs';
import { readFile, readdir, rm, rmdir } from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { NetworkPolicy } from '../../api/index.ts';
import { isMountPoint, readMountInfo, type LayerFiles } from '../../layers/index.ts';
import { destroyCgroupTrees, removeCgroupTree } from './cgroups.ts';
import type { RuntimeContext, SandboxRecord } from './context.ts';
import { CLASS_ANNOTATION, LAYERS_ANNOTATION, USER_ANNOTATION, WORKDIR_ANNOTATION, acquireLayers } from './create.ts';
import { readClaim } from './claim.ts';
import { ExecSlots } from './exec-slots.ts';
import { BESTEFFORT_ROOT, isSandboxId } from './layout.ts';
import { NO_NETWORK, readPolicy } from './policy.ts';
import { SANDBOX_INIT } from './spec.ts';
import { teardown, unmountRootfs } from './teardown.ts';
import { releaseDisk } from './disk-on-host.ts';

interface BundleConfig {
  annotations?: Record<string, string>;
  linux?: { resources?: { cpu?: { quota?: number } } };
}

/** Whether the container's PID 1 is rollbox-init (not an older layout's init) and its channel is there. */
async function hasOurInit(ctx: RuntimeContext, id: string): Promise<boolean> {
  const pid = await ctx.initPidOf(id).catch(() => undefined);
  if (!pid) return false;
  const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
  return cmdline.split('\0')[0] === SANDBOX_INIT && existsSync(ctx.layout.socketOf(id));
}

/**
 * Take over a live container left by a previous worker process: its layers referenced
 * again, its init reached again through the same socket (the init holds it, not the
 * worker), durable commands of the previous process left running for the next attach.
 */
async function adopt(ctx: RuntimeContext, id: string): Promise<boolean> {
  const { layout } = ctx;
  let config: BundleConfig;
  try {
    config = JSON.parse(await readFile(path.join(layout.bundleOf(id), 'config.json'), 'utf8')) as BundleConfig;
  } catch {
    return false;
  }
  if (!(await hasOurInit(ctx, id))) {
    ctx.log?.warn({ sandboxId: id }, 'cannot adopt sandbox: its PID 1 is not a reachable rollbox-init');
    return false;
  }
  const ann = config.annotations ?? {};
  const layers = JSON.parse(ann[LAYERS_ANNOTATION] ?? '[]') as LayerFiles[];
  const besteffort = ann[CLASS_ANNOTATION] === 'besteffort';
  const cg = await ctx.cgroups();
  const rel = layout.cgroupRelOf(id, besteffort);
  const slots = new ExecSlots({ pids: path.join(cg.pids, rel), freezer: path.join(cg.freezer, rel), memory: path.join(cg.memory, rel) });
  const claimed = readClaim(ctx, id);
  const user = claimed ? claimed.user : ann[USER_ANNOTATION];
  const rec: SandboxRecord = { id, layers: [], workdir: claimed?.workdir ?? ann[WORKDIR_ANNOTATION] ?? '/', ...(user ? { user } : {}), env: claimed?.env, besteffort, socketPath: layout.socketOf(id), slots };
  try {
    await acquireLayers(ctx, layers, rec);
  } catch (err) {
    await Promise.all(rec.layers.map((l) => ctx.layerMounts.release(l.digest)));
    ctx.log?.warn({ sandboxId: id, err: String(err) }, 'cannot adopt sandbox: its layers are not mountable');
    return false;
  }
  slots.adopt();
  // A worker that died while its guard held besteffort sandboxes back left them capped.
  if (besteffort && cg.cpu) {
    try {
      writeFileSync(ctx.besteffortQuotaFile(id, cg.cpu), String(config.linux?.resources?.cpu?.quota ?? -1));
    } catch (err) {
      ctx.log?.warn({ sandboxId: id, err: String(err) }, 'could not restore the CPU quota of an adopted besteffort sandbox');
    }
  }
  ctx.sandboxes.set(id, rec);
  ctx.initWatch.watch(id, rec.socketPath);
  // A worker that died between a start and letting go of the disk left it mounted here.
  if (existsSync(layout.diskDeviceFileOf(id)) && isMountPoint(layout.diskOf(id))) await releaseDisk(ctx, id);
  return true;
}

/**
 * Make the host match `keep` (meant for worker start and stop, when no create is in
 * flight): sandboxes in `keep` that still run are adopted; every other container, overlay
 * mount, layer mount, loop device, disk, socket and cgroup of this runtime is removed.
 */
export async function reconcile(ctx: RuntimeContext, keep: ReadonlySet<string>): Promise<{ adopted: string[]; removed: string[]; missing: string[] }> {
  const { layout } = ctx;
  await ctx.ensureDirs();
  const cg = await ctx.cgroups();
  const adopted = new Set<string>();
  const removed = new Set<string>();
  const removeOne = async (id: string): Promise<void> => {
    await ctx.locked(id, () => teardown(ctx, id, ctx.sandboxes.get(id)));
    removed.add(id);
  };

  // 1. Containers in our runc root.
  for (const name of await readdir(layout.runcRoot).catch(() => [] as string[])) {
    const id = layout.sandboxIdOfContainer(name);
    if (!id) continue;
    const keepIt = keep.has(id) && (await ctx.locked(id, async () => (await ctx.isRunningNow(id)) && (ctx.sandboxes.has(id) || (await adopt(ctx, id)))));
    if (keepIt) adopted.add(id);
    else await removeOne(id);
  }
  // 2. Records and bundles without a live container.
  for (const id of [...ctx.sandboxes.keys()]) if (!adopted.has(id)) await removeOne(id);
  for (const name of await readdir(layout.sandboxesDir).catch(() => [] as string[])) {
    if (adopted.has(name)) continue;
    if (isSandboxId(name)) await removeOne(name);
    else ctx.log?.warn({ name }, 'unexpected entry in sandboxes dir left alone');
  }
  // Init sockets of sandboxes that are gone.
  const liveSockets = new Set([...adopted].map((id) => path.basename(layout.socketOf(id))));
  for (const name of await readdir(layout.socketsDir).catch(() => [] as string[])) {
    if (!liveSockets.has(name)) await rm(path.join(layout.socketsDir, name), { force: true });
  }
  // Network: adopted sandboxes get their rules and DNS responder back, the rest their host side removed.
  if (ctx.network) {
    const live = new Map<string, { pid: number; policy: NetworkPolicy }>();
    for (const id of adopted) {
      const pid = await ctx.initPidOf(id).catch(() => undefined);
      if (pid) live.set(id, { pid, policy: (await readPolicy(ctx, id).catch(() => undefined))?.network ?? NO_NETWORK });
    }
    await ctx.network.reconcile(live);
  }
  // 3. Overlay mounts under our sandboxes dir that no bundle accounted for.
  for (const m of await readMountInfo()) {
    if (!m.mountPoint.startsWith(`${layout.sandboxesDir}/`)) continue;
    const id = m.mountPoint.slice(layout.sandboxesDir.length + 1).split('/')[0]!;
    if (adopted.has(id)) continue;
    await unmountRootfs(ctx, m.mountPoint);
  }
  // Fork points being packed when a worker died (the images go with step 6).
  for (const m of await readMountInfo()) if (m.mountPoint.startsWith(`${layout.forkPointMountsDir}/`)) await unmountRootfs(ctx, m.mountPoint);
  await rm(layout.forkPointMountsDir, { recursive: true, force: true });
  // 4. Cgroups under our parent that belong to no adopted sandbox.
  for (const h of cg.all) {
    for (const parent of layout.cgroupParents.map((p) => path.join(h, p))) {
      for (const e of await readdir(parent, { withFileTypes: true }).catch(() => [])) {
        if (!e.isDirectory()) continue;
        const id = layout.sandboxIdOfContainer(e.name);
        if (id && adopted.has(id)) continue;
        const dir = path.join(parent, e.name);
        await destroyCgroupTrees([dir], dir, h === cg.freezer ? dir : undefined);
        if (id) removed.add(id);
      }
    }
  }
  // 5. Layer mounts no adopted sandbox uses (and their loop devices).
  const inUse = new Set<string>();
  for (const id of adopted) for (const l of ctx.sandboxes.get(id)?.layers ?? []) inUse.add(l.digest);
  await ctx.layerMounts.reconcile(inUse);
  // 6. Disk images without a sandbox; with no sandbox left, the scratch filesystem itself.
  ctx.scratch.removeStrayImages(adopted, await readdir(ctx.scratch.disksDir).catch(() => [] as string[]));
  if (adopted.size === 0) {
    await ctx.scratch.teardown();
    ctx.diskHelper.close();
    for (const h of cg.all) {
      // A just-emptied child cgroup can keep its parent busy for a moment (memcg offlining).
      for (const parent of layout.cgroupParents) for (let tries = 0; !removeCgroupTree(path.join(h, parent)) && tries < 40; tries++) await sleep(25);
      // Shared by every node id on the host: only go when empty.
      for (const root of ['rollbox', BESTEFFORT_ROOT]) await rmdir(path.join(h, root)).catch(() => undefined);
    }
  }
  return { adopted: [...adopted], removed: [...removed], missing: [...keep].filter((id) => !adopted.has(id)) };
}
