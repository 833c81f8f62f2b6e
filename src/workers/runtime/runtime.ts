import path from 'node:path';
import { RollboxError } from '../../api/index.ts';
import { readOomKills } from './cgroups.ts';
import { createRuntimeContext, type RuncRuntimeDeps } from './context.ts';
import { claimSandbox } from './claim.ts';
import { createSandbox } from './create.ts';
import { attachCommand, execCommand, execRawCommand } from './exec.ts';
import { releaseCommands, resizeCommand, signalCommand, writeCommandStdin } from './live-commands.ts';
import { checkSandboxId } from './layout.ts';
import { applyPolicy, freezerStateFile, setFrozen } from './policy.ts';
import { reconcile } from './reconcile.ts';
import { packUpperDir, upperDirOfBundle } from './snapshot.ts';
import { teardown } from './teardown.ts';
import { ForkPoints } from './fork-point.ts';
import { withDiskOnHost } from './disk-on-host.ts';
import { SandboxMetricsReader } from './metrics.ts';
import { memoryHeldUnder, resumeSwapped, swapOut } from './swap-out.ts';
import { SwapSpace } from '../../swap/index.ts';
import type { SandboxRuntime } from './types.ts';

export interface RuncRuntime extends SandboxRuntime {
  readonly runcRoot: string;
  readonly sandboxesDir: string;
  /** Mount point of the host's scratch filesystem (sandbox disks live in it). */
  readonly scratchDir: string;
  /** Cgroup parent (relative to each hierarchy's root): `rollbox/<nodeId>`. */
  readonly cgroupParent: string;
  containerIdOf(sandboxId: string): string;
  /** The init's private channel of a sandbox (a unix socket on the host). */
  initSocketOf(sandboxId: string): string;
}

/**
 * The runc-backed SandboxRuntime. Per sandbox: a bundle with a generated config.json, a
 * private overlay upper dir (on its own capped disk) over its layers (each EROFS image
 * loop-mounted once per host), and a container whose PID 1 is rollbox-init; every command
 * and file operation is forked by that init, reached over a socket only the host sees.
 * runc itself only starts containers. The parts: create.ts, exec.ts, policy.ts,
 * teardown.ts, reconcile.ts over the shared context.ts (paths in layout.ts).
 */
export function createRuncRuntime(deps: RuncRuntimeDeps): RuncRuntime {
  const ctx = createRuntimeContext(deps);
  const { layout } = ctx;
  const oomKillCount = async (id: string): Promise<number> => {
    checkSandboxId(id);
    return readOomKills(path.join((await ctx.cgroups()).memory, ctx.cgroupRel(id)));
  };
  const forkPoints = new ForkPoints(ctx);
  const swap = deps.swap && new SwapSpace(deps.swap);
  const metrics = new SandboxMetricsReader(ctx, (id, spec) => execRawCommand(ctx, id, spec));
  return {
    runcRoot: layout.runcRoot,
    sandboxesDir: layout.sandboxesDir,
    scratchDir: ctx.scratch.mountPoint,
    cgroupParent: layout.cgroupParent,
    containerIdOf: (id) => layout.containerIdOf(id),
    initSocketOf: (id) => layout.socketOf(id),
    create: (spec) => createSandbox(ctx, spec),
    claim: (id, binding) => {
      checkSandboxId(id);
      return claimSandbox(ctx, id, binding);
    },
    exec: (id, spec) => execCommand(ctx, id, spec),
    execRaw: (id, spec) => execRawCommand(ctx, id, spec),
    attach: (id, spec) => attachCommand(ctx, id, spec),
    signalCommand: (id, commandId, signo) => signalCommand(ctx, id, commandId, signo),
    writeCommandStdin: (id, commandId, data, eof) => writeCommandStdin(ctx, id, commandId, data, eof),
    resizeCommand: (id, commandId, size) => resizeCommand(ctx, id, commandId, size),
    async destroy(id) {
      checkSandboxId(id);
      await ctx.ensureDirs();
      await ctx.locked(id, () => teardown(ctx, id, ctx.sandboxes.get(id)));
    },
    async snapshot(id, options) {
      checkSandboxId(id);
      // Where the disk can be cloned: frozen only for the clone (~1 ms), packed from the clone.
      const clone = `snap-${id}-${Date.now().toString(36)}`;
      const made = await forkPoints.make(id, clone);
      if (made) {
        try {
          await forkPoints.pack(clone, options.outPath, options.excludePaths);
          return made;
        } finally {
          forkPoints.remove(clone);
        }
      }
      const upperDir = await upperDirOfBundle(layout.bundleOf(id));
      const freezerState = await freezerStateFile(ctx, id);
      return withDiskOnHost(ctx, id, () => packUpperDir({ upperDir, freezerStateFile: freezerState, ...options }));
    },
    makeForkPoint(id, forkPointId) {
      checkSandboxId(id);
      checkSandboxId(forkPointId);
      return forkPoints.make(id, forkPointId);
    },
    packForkPoint: (forkPointId, outPath) => {
      checkSandboxId(forkPointId);
      return forkPoints.pack(forkPointId, outPath);
    },
    removeForkPoint: (forkPointId) => {
      checkSandboxId(forkPointId);
      forkPoints.remove(forkPointId);
    },
    // A container hibernates as its packed writable layer (the worker's hibernate op): its processes end.
    hibernatesWhole: () => false,
    hibernateWhole: async () => {
      throw new RollboxError('internal', 'a container is not saved whole; it hibernates as its packed writable layer');
    },
    // No process checkpoint on this kernel (CRIU fails, DESIGN.md): a container forks its files only.
    forkWhole: async () => {
      throw new RollboxError('tier_unsupported', 'the container tier cannot fork processes (CRIU does not work on this kernel): fork with processes: false, or use the microvm tier');
    },
    applyPolicy: (id, change) => {
      checkSandboxId(id);
      return applyPolicy(ctx, id, change);
    },
    pause: (id) => setFrozen(ctx, id, true),
    swapOut: (id) => (checkSandboxId(id), swapOut(ctx, swap, id)),
    memoryHeld: () => memoryHeldUnder(ctx, layout.cgroupParents),
    resume: (id) => (checkSandboxId(id), resumeSwapped(ctx, swap, deps.memctlBinary, id)),
    async isRunning(id) {
      checkSandboxId(id);
      return ctx.isRunningNow(id);
    },
    oomKillCount,
    async exitCause(id) {
      return (await oomKillCount(id)) > 0
        ? { reason: 'oom', detail: 'the sandbox init was killed by the OOM killer' }
        : { reason: 'init_lost', detail: 'the sandbox init process died' };
    },
    async reconcile(keep) {
      const result = await reconcile(ctx, keep);
      // No sandbox left here (a start on an empty host, a stop that destroyed them): neither is
      // anything in the swap file, which goes. Sandboxes adopted keep it, paged out or not.
      if (result.adopted.length === 0) await swap?.remove().catch((err: unknown) => ctx.log?.warn({ err: String(err), file: swap.filePath }, 'could not remove the swap file'));
      return result;
    },
    onExit(listener) {
      ctx.exitListener = listener;
    },
    detach() {
      releaseCommands(ctx);
      ctx.exitListener = undefined;
      ctx.initWatch.close();
    },
    mountedLayers: () => ctx.layerMounts.mounted(),
    sandboxesUsingLayers: (digests) => [...ctx.sandboxes.values()].filter((r) => r.layers.some((l) => digests.has(l.digest))).map((r) => r.id),
    unmountUnused: (digests) => ctx.layerMounts.unmountUnused(digests),
    diskSpace: () => ({ ...ctx.scratch.space(), preallocated: deps.preallocateDisks ?? false }),
    metrics: (id) => (checkSandboxId(id), metrics.read(id)),
    netnsPidOf: (id) => (checkSandboxId(id), ctx.initPidOf(id)),
  };
}

export type { RuncRuntimeDeps } from './context.ts';
