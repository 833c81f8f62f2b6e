import { closeSync, existsSync, mkdirSync, openSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { RollboxError } from '../../api/index.ts';
import { listenForInit } from '../init/index.ts';
import type { RuntimeContext, SandboxRecord } from './context.ts';
import { ExecSlots, type SandboxCgroupDirs } from './exec-slots.ts';
import { validateCreate } from './layout.ts';
import { applyNetwork, NO_NETWORK, writePolicy } from './policy.ts';
import { runTool, runToolOk } from '../../proc/index.ts';
import { readProcs } from './cgroups.ts';
import { lastRuncError } from './runc.ts';
import { CPU_PERIOD_US, containerConfig } from './spec.ts';
import { teardown } from './teardown.ts';
import { recordDiskDevice, releaseDisk } from './disk-on-host.ts';
import type { SandboxPolicy, SandboxRuntimeSpec } from './types.ts';
import type { LayerFiles } from '../../layers/index.ts';

export const LAYERS_ANNOTATION = 'io.rollbox.layers';
export const WORKDIR_ANNOTATION = 'io.rollbox.workdir';
export const USER_ANNOTATION = 'io.rollbox.user';
export const CLASS_ANNOTATION = 'io.rollbox.class';

/**
 * Start one sandbox. The lifecycle, in order:
 *   1. bundle dirs; its layers mounted (shared per host) and its own disk attached, together
 *   2. a hibernated sandbox's writable layer copied back into the new upper dir
 *   3. its cgroups made (runc fills in the limits) and config.json written
 *   4. `runc run -d` of rollbox-init, handed its private socket and its cgroup directories
 *   5. the init's oom_score_adj, besteffort CPU settings
 *   6. the network policy, before any command runs
 * A failure at any step tears down what the earlier ones made.
 */
export async function createSandbox(ctx: RuntimeContext, spec: SandboxRuntimeSpec): Promise<void> {
  const id = spec.sandboxId;
  validateCreate(spec);
  await ctx.ensureDirs();
  await ctx.locked(id, async () => {
    const { layout } = ctx;
    if (ctx.sandboxes.has(id) && (await ctx.isRunningNow(id))) return; // a retried create
    const bundle = layout.bundleOf(id);
    if (ctx.sandboxes.has(id) || existsSync(bundle) || existsSync(path.dirname(layout.runcStateOf(id)))) {
      await teardown(ctx, id, ctx.sandboxes.get(id)); // leftovers of a failed or dead attempt
    }
    // A layer listed twice would be rejected by overlayfs; keep its topmost position.
    const layers = spec.layerImages.filter((l, i) => !spec.layerImages.slice(i + 1).some((m) => m.digest === l.digest));
    const besteffort = spec.class === 'besteffort';
    const cg = await ctx.cgroups();
    const rel = layout.cgroupRelOf(id, besteffort);
    const cgroupDirs: SandboxCgroupDirs = { pids: path.join(cg.pids, rel), freezer: path.join(cg.freezer, rel), memory: path.join(cg.memory, rel) };
    const rec: SandboxRecord = { id, layers: [], workdir: spec.workdir, ...(spec.user ? { user: spec.user } : {}), besteffort, socketPath: layout.socketOf(id), slots: new ExecSlots(cgroupDirs) };
    try {
      // 1. Synchronous on purpose, here and below: each of these local-fs calls takes
      // microseconds, while a round trip through libuv's thread pool costs ~0.2-0.5 ms.
      mkdirSync(bundle, { mode: 0o700 });
      for (const d of ['disk', 'rootfs']) mkdirSync(path.join(bundle, d));
      const disk = layout.diskOf(id);
      // allSettled: the cleanup below must not start while either is still running.
      const settled = await Promise.allSettled([acquireLayers(ctx, layers, rec), ctx.scratch.attach(id, spec.resources.diskMiB, disk, spec.forkPoint)]);
      for (const r of settled) if (r.status === 'rejected') throw r.reason;
      recordDiskDevice(ctx, id, (settled[1] as PromiseFulfilledResult<string>).value);
      // 2.
      if (spec.restoreUpper) await restoreUpper(ctx, spec.restoreUpper, path.join(disk, 'upper'));
      // 3. runc joins cgroups that exist and writes their limits; made here, the init can
      // be handed them as directories (its commands join their exec cgroups through them).
      if (besteffort) await ctx.ensureBesteffortRoot();
      for (const dir of Object.values(cgroupDirs)) mkdirSync(dir, { recursive: true });
      const config = containerConfig({
        hostname: layout.containerIdOf(id).slice(0, 63),
        env: spec.env,
        workdir: spec.workdir,
        resources: spec.resources,
        class: spec.class,
        hiddenPaths: spec.hiddenPaths,
        cgroupsPath: `/${rel}`,
        initBinaryPath: ctx.initBinaryPath,
        busyboxPath: ctx.busyboxPath,
        rootfs: { lowerdirs: lowerDirs(ctx, bundle, layers), upperdir: path.join(disk, 'upper'), workdir: path.join(disk, 'work') },
        oomScoreAdj: ctx.sandboxOomScoreAdj,
        limitSwap: cg.memsw,
        seccomp: ctx.seccomp,
        allowPrivilegeEscalation: spec.allowPrivilegeEscalation === true,
        annotations: {
          'io.rollbox.sandbox': id,
          [LAYERS_ANNOTATION]: JSON.stringify(layers),
          [WORKDIR_ANNOTATION]: spec.workdir,
          ...(spec.user ? { [USER_ANNOTATION]: spec.user } : {}),
          [CLASS_ANNOTATION]: spec.class,
        },
      });
      writeFileSync(path.join(bundle, 'config.json'), JSON.stringify(config));
      // 4.
      const pid = await startContainer(ctx, id, besteffort || spec.lowPriority === true, rec.socketPath, cgroupDirs);
      await releaseDisk(ctx, id);
      // A latency sandbox started low (a pool's refill) leaves SCHED_IDLE now, in the
      // background, so its claim need not: runc's work was what had to yield.
      if (spec.lowPriority && !besteffort) await leaveIdleScheduling(ctx, readProcs(cgroupDirs.pids));
      // 5. The init is tiny; keep it out of the way of the OOM killer relative to the
      // commands it hosts. Lowering it back from the config's positive value needs no
      // CAP_SYS_RESOURCE (which this host withholds) as long as we stay at or above the
      // worker's own value, hence 0 rather than -1000; best effort.
      try {
        writeFileSync(`/proc/${pid}/oom_score_adj`, '0');
      } catch {
        // not permitted below the worker's own floor: the init keeps the sandbox value
      }
      // cpu.idle (kernel >= 5.15, v1 too) on the sandbox's group as well: SCHED_IDLE next
      // to its besteffort siblings; its tasks' own SCHED_IDLE only orders them against
      // tasks of the same group. Best effort.
      const cpuIdleFile = cg.cpu && path.join(cg.cpu, rel, 'cpu.idle');
      if (besteffort && cpuIdleFile && existsSync(cpuIdleFile)) writeFileSync(cpuIdleFile, '1');
      // Again now that this sandbox's cgroup pins the tree's top: another node id's last
      // sandbox ending may have removed (an empty) top between step 3 and runc's mkdir.
      if (besteffort) await ctx.ensureBesteffortRoot();
      if (besteffort && cg.cpu) ctx.guard.started(ctx.besteffortQuotaFile(id, cg.cpu));
      // CFS burst (kernel >= 5.14) for latency sandboxes: quota a sandbox left unused in one
      // period may be spent in the next, up to one more quota (the kernel's cap). An agent
      // on a small quota sits idle while its model thinks; its next command then does not
      // wait for a second period (at cpuMillis 10 an exec of `sh -c true` costs ~1.5 ms of
      // CPU against 1 ms per 100 ms). The long-run average stays at the quota. Not for
      // besteffort sandboxes: the guard lowers their quota below any burst. Best effort.
      const burstFile = cg.cpu && path.join(cg.cpu, rel, 'cpu.cfs_burst_us');
      if (!besteffort && burstFile && existsSync(burstFile)) writeFileSync(burstFile, String(spec.resources.cpuMillis * (CPU_PERIOD_US / 1000)));
      // 6. Before the sandbox is reported running (no command has run in it yet).
      const policy: SandboxPolicy = { network: spec.network ?? NO_NETWORK, hiddenPaths: spec.hiddenPaths };
      await applyNetwork(ctx, id, pid, policy.network);
      writePolicy(ctx, id, policy);
      ctx.sandboxes.set(id, rec);
      ctx.initWatch.watch(id, rec.socketPath);
    } catch (err) {
      await teardown(ctx, id, rec).catch((e: unknown) => ctx.log?.warn({ sandboxId: id, err: String(e) }, 'cleanup after failed create failed'));
      if (err instanceof RollboxError) throw err;
      throw new RollboxError('internal', `creating sandbox ${id} failed: ${err instanceof Error ? err.message : String(err)}`);
    }
  });
}

/**
 * `runc run -d` of rollbox-init with, as fds 3..6 (`--preserve-fds 4`), its listening
 * socket and the directories of its pids, freezer and memory cgroups. Returns the init's
 * host pid. stdio is /dev/null: a detached container inherits runc's stdio, and a pipe
 * held by the init would never close; runc's errors go to its --log file instead.
 */
async function startContainer(ctx: RuntimeContext, id: string, idlePriority: boolean, socketPath: string, cgroupDirs: SandboxCgroupDirs): Promise<number> {
  const { layout } = ctx;
  const bundle = layout.bundleOf(id);
  const listener = await listenForInit(socketPath);
  const dirFds = [cgroupDirs.pids, cgroupDirs.freezer, cgroupDirs.memory].map((d) => openSync(d, 'r'));
  let started = false;
  try {
    const logFile = path.join(bundle, 'runc.log');
    const [file, args] = ctx.runc(idlePriority, '--log', logFile, '--log-format', 'json', 'run', '--detach', '--preserve-fds', '4', '--bundle', bundle, layout.containerIdOf(id));
    const r = await runTool(file, args, { output: 'ignore', extraFds: [listener.fd, ...dirFds] });
    if (r.code !== 0) throw new RollboxError('internal', `runc run failed: ${await lastRuncError(logFile)}`);
    listener.handOver();
    started = true;
    // (The pid comes from runc's state.json; --pid-file measurably slows `runc run`.)
    return (JSON.parse(readFileSync(layout.runcStateOf(id), 'utf8')) as { init_process_pid: number }).init_process_pid;
  } finally {
    for (const fd of dirFds) closeSync(fd);
    if (!started) await listener.abandon();
  }
}

export async function acquireLayers(ctx: RuntimeContext, layers: LayerFiles[], rec: SandboxRecord): Promise<void> {
  const results = await Promise.allSettled(layers.map((l) => ctx.layerMounts.acquire(l).then(() => l)));
  for (const r of results) if (r.status === 'fulfilled') rec.layers.push(r.value);
  const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) throw failed.reason;
}

/**
 * Overlay lower dirs, top layer first. The overlay is mounted by runc inside the
 * container's mount namespace (an OCI mount at "/"), not on the host: that saves a
 * mount(8) and a umount(8) spawn per sandbox (each ~5 ms here) and the kernel removes it
 * when the container dies, so a crashed worker cannot leak overlay mounts. mount(2) caps
 * its option string at a page, so with many layers we point at short symlinks instead.
 */
function lowerDirs(ctx: RuntimeContext, bundle: string, layers: { digest: string }[]): string[] {
  const dirs = [...layers].reverse().map((l) => ctx.layerMounts.dirOf(l.digest));
  // The option string also holds upperdir=<bundle>/disk/upper and workdir=<bundle>/disk/work.
  if (dirs.join(':').length + (bundle.length + 12) * 2 < 3000) return dirs;
  mkdirSync(path.join(bundle, 'l'));
  dirs.forEach((d, i) => symlinkSync(d, path.join(bundle, 'l', String(i))));
  return dirs.map((_d, i) => path.join(bundle, 'l', String(i)));
}

/**
 * Waking from hibernation: the packed writable layer goes back into the new upper dir as
 * it was (whiteouts as 0:0 devices, opaque dirs by their xattr), so the next hibernation
 * packs one layer again instead of stacking one more: the chain stays bounded. `cp -a`
 * copies into a fresh, empty dir and copies links as links, never through them.
 */
async function restoreUpper(ctx: RuntimeContext, layer: LayerFiles, upperDir: string): Promise<void> {
  const dir = await ctx.layerMounts.acquire(layer);
  try {
    const r = await runTool('cp', ['-a', '--', `${dir}/.`, `${upperDir}/`]);
    if (r.code !== 0) throw new RollboxError('internal', `restoring the hibernated writable layer failed: ${r.stderr.trim().slice(0, 500)}`);
  } finally {
    await ctx.layerMounts.release(layer.digest);
  }
}

/** x86_64 syscall numbers, for the one perl process that resets the scheduling policy. */
const SYS_SCHED_SETSCHEDULER = 144;
const SCHED_OTHER = 0;

/** SCHED_OTHER for these processes (the init and its keepers), in one perl process. */
async function leaveIdleScheduling(ctx: RuntimeContext, pids: number[]): Promise<void> {
  const perl = `for (@ARGV) { my $param = pack("i", 0); syscall(${SYS_SCHED_SETSCHEDULER}, $_ + 0, ${SCHED_OTHER}, $param) == 0 or die "sched_setscheduler $_: $!\\n" }`;
  await runToolOk(ctx.perlBinary ?? 'perl', ['-e', perl, ...pids.map(String)]);
}
