import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { RollboxError } from '../../api/index.ts';
import type { LayerFiles, LayerMounts } from '../../layers/index.ts';
import type { SandboxNetworks } from '../network/index.ts';
import { besteffortGuardOf, type BesteffortGuard } from './besteffort-guard.ts';
import { discoverCgroups, type CgroupHierarchies } from './cgroups.ts';
import { DiskHelper } from './diskhelper.ts';
import type { ExecSlots } from './exec-slots.ts';
import { BESTEFFORT_ROOT, RuntimeLayout } from './layout.ts';
import { isProcessAlive, readRuncState, type RuncState } from './runc.ts';
import { ScratchDisks } from './scratch.ts';
import type { ScratchFsType } from './scratch-image.ts';
import { DEFAULT_INIT_BINARY } from '../init/index.ts';
import { InitWatch } from './init-watch.ts';
import type { SwapSpaceOptions } from '../../swap/index.ts';
import type { RuntimeLogger } from './logger.ts';

export interface RuncRuntimeDeps {
  /** Everything of this runtime lives here (see layout.ts). */
  dataDir: string;
  /** Cgroups go under `/rollbox/<nodeId>/` in every hierarchy. */
  nodeId: string;
  layerMounts: LayerMounts;
  /** OCI runtime binary (default `runc`). */
  runtimeBinary?: string;
  /** The sandboxes' PID 1, built from src/workers/init/rollbox-init.c (default build/rollbox-init). */
  initBinaryPath?: string;
  /** Static busybox bound read-only into every container; the files API runs it (default /bin/busybox). */
  busyboxPath?: string;
  logger?: RuntimeLogger;
  /** Only for leftovers: sandbox overlays are mounted inside the container (see create.ts). */
  umountBinary?: string;
  /** For besteffort sandboxes: their init (and so every command) runs under `chrt --idle 0` (SCHED_IDLE). */
  chrtBinary?: string;
  /**
   * oom_score_adj of every command (default 500). Positive, so a host-wide OOM picks
   * sandbox processes before the worker; the init itself is lowered to 0 (see create.ts).
   */
  sandboxOomScoreAdj?: number;
  /** Apply the seccomp deny-list of spec.ts (default true). */
  seccomp?: boolean;
  /** After an exec's timeout kill, how long to wait for the init's report before dropping the command. */
  execKillGraceMs?: number;
  /** Size of the host's scratch filesystem that holds every sandbox's disk (see scratch.ts). */
  scratchSizeGiB?: number;
  /** The scratch filesystem's type (default xfs: disks can be cloned for forks; see scratch.ts). */
  scratchFs?: ScratchFsType;
  /** See ScratchDisksDeps.idleUnmountDelayMs. */
  scratchIdleUnmountMs?: number;
  /** Reserve each sandbox's whole diskMiB in the scratch filesystem (default false; see scratch.ts). */
  preallocateDisks?: boolean;
  /** Runs the disk syscalls (loop attach, mount, umount); see diskhelper.ts. Default `perl`. */
  perlBinary?: string;
  mkfsBinary?: string;
  losetupBinary?: string;
  /** Sandbox networking (`network.mode: allowlist`); without it only `none` is available. */
  network?: SandboxNetworks;
  /** How long one exec with holdBackBesteffort may cap besteffort sandboxes (BesteffortGuard); default 0, off. */
  besteffortHoldMs?: number;
  /** CPU each besteffort sandbox keeps while held, in millicores (default 10, the kernel's least). */
  besteffortHeldCpuMillis?: number;
  /** A guard shared with the host's other runtime (its microVMs), instead of one of its own from the two above. */
  besteffortGuard?: BesteffortGuard;
  /** The host's swap file for pause mode `swap` (see SwapSpace); absent: every swap pause is refused `swap_unavailable`. */
  swap?: SwapSpaceOptions;
  /** Prefetches a swapped sandbox's memory on resume (default build/rollbox-memctl). */
  memctlBinary?: string;
}

/** What this runtime process knows of one sandbox it runs. */
export interface SandboxRecord {
  id: string;
  /** Layers this process holds references on, base first (released exactly once). */
  layers: LayerFiles[];
  workdir: string;
  /** Who commands run as when an exec names nobody (the create's, or a claim's); none: root. */
  user?: string;
  /** Bound by a claim (warm pools): every command's environment starts from it. */
  env?: Record<string, string>;
  besteffort: boolean;
  /** The init's private channel. */
  socketPath: string;
  slots: ExecSlots;
}

/** Everything the runtime's parts (create, exec, teardown, reconcile, policy) share. */
export interface RuntimeContext {
  layout: RuntimeLayout;
  log?: RuntimeLogger;
  layerMounts: LayerMounts;
  network?: SandboxNetworks;
  runcBin: string;
  initBinaryPath: string;
  busyboxPath: string;
  umountBin: string;
  chrtBin: string;
  perlBinary?: string;
  sandboxOomScoreAdj: number;
  seccomp: boolean;
  execKillGraceMs: number;
  scratch: ScratchDisks;
  diskHelper: DiskHelper;
  guard: BesteffortGuard;
  sandboxes: Map<string, SandboxRecord>;
  /** Tells of inits that die while no destroy stops them (see init-watch.ts). */
  initWatch: InitWatch;
  /** Connections to durable commands this process holds; detach() lets go of them (exec.ts). */
  commandChannels: Set<{ release(): void }>;
  /** The listener `onExit` registered: the host's, told of each such death. */
  exitListener?: (sandboxId: string) => void;
  /** Serializes create/destroy/adopt/policy per sandbox id; exec does not take the lock. */
  locked<T>(id: string, fn: () => Promise<T>): Promise<T>;
  cgroups(): Promise<CgroupHierarchies>;
  ensureDirs(): Promise<void>;
  /** The sandbox's cgroup (relative), in the tree of its class. */
  cgroupRel(id: string): string;
  /** cpu.cfs_quota_us of a besteffort sandbox. */
  besteffortQuotaFile(id: string, cpuHierarchy: string): string;
  /** The besteffort tree's top: idle in the cpu hierarchy before any sandbox runs in it. */
  ensureBesteffortRoot(): Promise<void>;
  /** runc with the runtime's state root; under `chrt --idle 0` for a besteffort sandbox. */
  runc(besteffort: boolean, ...args: string[]): [string, string[]];
  /** Whether the sandbox's container has a live init. */
  isRunningNow(id: string): Promise<boolean>;
  /** Forgets the init identity read from runc's state (teardown: the id may get a new container). */
  forgetInit(id: string): void;
  /** The init's host pid; invalid_state when it is not running. */
  initPidOf(id: string): Promise<number>;
}

export function createRuntimeContext(deps: RuncRuntimeDeps): RuntimeContext {
  const layout = new RuntimeLayout(deps.dataDir, deps.nodeId);
  const initBinaryPath = deps.initBinaryPath ?? DEFAULT_INIT_BINARY;
  if (!existsSync(initBinaryPath)) {
    throw new RollboxError('internal', `the sandbox init ${initBinaryPath} is missing: build it with scripts/build-init.sh (npm start and npm test do)`);
  }
  const log = deps.logger;
  const diskHelper = new DiskHelper({ perlBinary: deps.perlBinary });
  const sandboxes = new Map<string, SandboxRecord>();
  /**
   * Each container's init (pid and start time), read from runc's state.json once: that
   * file holds the whole config (~10 KB of JSON), and liveness checks (the audit, an init
   * channel's close) only need the pid's /proc/PID/stat.
   */
  const inits = new Map<string, RuncState>();
  const initOf = async (id: string): Promise<RuncState | undefined> => {
    const known = inits.get(id);
    if (known) return known;
    const state = await readRuncState(layout.runcStateOf(id));
    if (state) inits.set(id, { init_process_pid: state.init_process_pid, init_process_start: state.init_process_start });
    return state;
  };
  const locks = new Map<string, Promise<unknown>>();
  let cgroupsPromise: Promise<CgroupHierarchies> | undefined;
  let cgroupsFound: CgroupHierarchies | undefined;
  let dirsReady: Promise<void> | undefined;
  const runcBin = deps.runtimeBinary ?? 'runc';
  const chrtBin = deps.chrtBinary ?? 'chrt';

  const cgroupRelOf = (id: string, besteffort: boolean): string => layout.cgroupRelOf(id, besteffort);
  const besteffortQuotaFile = (id: string, cpu: string): string => path.join(cpu, cgroupRelOf(id, true), 'cpu.cfs_quota_us');
  const guard = deps.besteffortGuard ?? besteffortGuardOf({ holdMs: deps.besteffortHoldMs ?? 0, heldCpuMillis: deps.besteffortHeldCpuMillis, onError: (file, err) => log?.warn({ file, err: String(err) }, 'besteffort guard could not write a CPU quota') });
  // Every besteffort sandbox got here through create or adopt, which found the hierarchies.
  guard.addQuotaFiles(() => {
    const cpu = cgroupsFound?.cpu;
    return cpu ? [...sandboxes.values()].filter((r) => r.besteffort).map((r) => besteffortQuotaFile(r.id, cpu)) : [];
  });

  const ctx: RuntimeContext = {
    layout,
    log,
    layerMounts: deps.layerMounts,
    network: deps.network,
    runcBin,
    initBinaryPath,
    busyboxPath: deps.busyboxPath ?? '/bin/busybox',
    umountBin: deps.umountBinary ?? 'umount',
    chrtBin,
    perlBinary: deps.perlBinary,
    sandboxOomScoreAdj: deps.sandboxOomScoreAdj ?? 500,
    seccomp: deps.seccomp ?? true,
    execKillGraceMs: deps.execKillGraceMs ?? 2000,
    diskHelper,
    scratch: new ScratchDisks({
      dataDir: layout.dataDir,
      helper: diskHelper,
      sizeGiB: deps.scratchSizeGiB,
      fsType: deps.scratchFs,
      idleUnmountDelayMs: deps.scratchIdleUnmountMs,
      preallocate: deps.preallocateDisks,
      mkfsBinary: deps.mkfsBinary,
      losetupBinary: deps.losetupBinary,
      logger: log,
    }),
    guard,
    sandboxes,
    commandChannels: new Set(),
    initWatch: new InitWatch({
      confirmDead: async (id) => !(await ctx.isRunningNow(id)),
      onDeath: (id) => ctx.exitListener?.(id),
      onError: (id, err) => log?.warn({ sandboxId: id, err: String(err) }, 'checking a closed init channel failed'),
    }),
    async locked<T>(id: string, fn: () => Promise<T>): Promise<T> {
      const prev = locks.get(id) ?? Promise.resolve();
      const run = prev.then(fn, fn);
      const tail = run.catch(() => undefined);
      locks.set(id, tail);
      try {
        return await run;
      } finally {
        if (locks.get(id) === tail) locks.delete(id);
      }
    },
    cgroups: () => (cgroupsPromise ??= discoverCgroups().then((found) => (cgroupsFound = found))),
    ensureDirs: () =>
      (dirsReady ??= Promise.all([layout.runcRoot, layout.sandboxesDir, layout.socketsDir].map((d) => mkdir(d, { recursive: true, mode: 0o700 }))).then(() => undefined)),
    cgroupRel: (id) => cgroupRelOf(id, sandboxes.get(id)?.besteffort ?? false),
    besteffortQuotaFile,
    async ensureBesteffortRoot() {
      const cpu = (await ctx.cgroups()).cpu;
      if (!cpu) return;
      const root = path.join(cpu, BESTEFFORT_ROOT);
      mkdirSync(root, { recursive: true });
      if (existsSync(path.join(root, 'cpu.idle'))) writeFileSync(path.join(root, 'cpu.idle'), '1');
    },
    runc: (besteffort, ...args) => {
      const full = ['--root', layout.runcRoot, ...args];
      return besteffort ? [chrtBin, ['--idle', '0', runcBin, ...full]] : [runcBin, full];
    },
    async isRunningNow(id) {
      const state = await initOf(id);
      return !!state && isProcessAlive(state.init_process_pid, state.init_process_start);
    },
    forgetInit: (id) => void inits.delete(id),
    async initPidOf(id) {
      const state = await initOf(id);
      if (!state || !isProcessAlive(state.init_process_pid, state.init_process_start)) throw new RollboxError('invalid_state', `sandbox ${id} is not running`);
      return state.init_process_pid;
    },
  };
  return ctx;
}
