import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { mkdir, readFile, readdir, rm, rmdir } from 'node:fs/promises';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { RollboxError } from '../../api/index.ts';
import { isMountPoint, readMountInfo, type LayerMounts } from '../../layers/index.ts';
import {
  destroyCgroupTrees,
  discoverCgroups,
  killCgroup,
  makeCgroup,
  migrateProcs,
  readOomKills,
  readProcs,
  removeCgroupTree,
  setFreezerState,
  type CgroupHierarchies,
} from './cgroups.ts';
import type { NetworkPolicy } from '../../api/index.ts';
import type { SandboxNetworks } from '../network/index.ts';
import { inMountNamespace, mountPointsOf, type MountNsOp } from './mountns.ts';
import { isProcessAlive, lastRuncError, readRuncState, runQuiet } from './runc.ts';
import { BesteffortGuard } from './besteffort-guard.ts';
import { DiskHelper } from './diskhelper.ts';
import { ScratchDisks } from './scratch.ts';
import { packUpperDir, upperDirOfBundle } from './snapshot.ts';
import { CPU_PERIOD_US, MASKED_PATHS, containerConfig, envList } from './spec.ts';
import type { RuntimeExecOutcome, RuntimeExecSpec, RuntimeRawExecOutcome, RuntimeRawExecSpec, SandboxPolicy, SandboxRuntime, SandboxRuntimeSpec } from './types.ts';

export interface RuntimeLogger {
  warn(obj: object, msg?: string): void;
  info(obj: object, msg?: string): void;
}

export interface RuncRuntimeDeps {
  /** Everything of this runtime lives here: `runc/` (state root), `sandboxes/<id>/` (bundles). */
  dataDir: string;
  /** Cgroups go under `/rollbox/<nodeId>/` in every hierarchy. */
  nodeId: string;
  layerMounts: LayerMounts;
  /** OCI runtime binary (default `runc`). */
  runtimeBinary?: string;
  /** Static busybox bound read-only into every container to run its init (default /bin/busybox). */
  busyboxPath?: string;
  logger?: RuntimeLogger;
  /** Only for leftovers: sandbox overlays are mounted inside the container (see lowerDirs). */
  umountBinary?: string;
  /** For besteffort sandboxes: their processes run under `chrt --idle 0` (SCHED_IDLE). */
  chrtBinary?: string;
  /**
   * oom_score_adj of every sandbox process (default 500). Positive, so a host-wide OOM picks
   * sandbox processes before the worker; the init is then lowered to 0 (see create).
   */
  sandboxOomScoreAdj?: number;
  /** Apply the seccomp deny-list of spec.ts (default true). */
  seccomp?: boolean;
  /** After an exec's timeout kill, how long to wait for runc before killing runc itself. */
  execKillGraceMs?: number;
  /**
   * Size of the host's scratch filesystem that holds every sandbox's disk (see scratch.ts).
   * Default: half the free space under dataDir when it is created, at most 64 GiB.
   */
  scratchSizeGiB?: number;
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
}

export interface RuncRuntime extends SandboxRuntime {
  readonly runcRoot: string;
  readonly sandboxesDir: string;
  /** Mount point of the host's scratch filesystem (sandbox disks live in it). */
  readonly scratchDir: string;
  /** Cgroup parent (relative to each hierarchy's root): `rollbox/<nodeId>`. */
  readonly cgroupParent: string;
  containerIdOf(sandboxId: string): string;
}

interface SandboxRecord {
  id: string;
  containerId: string;
  bundle: string;
  /** Layers this process holds references on, base first (released exactly once). */
  layers: { digest: string; imagePath: string }[];
  workdir: string;
  besteffort: boolean;
}

const SANDBOX_ID_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;
const NODE_ID_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/;
const LAYERS_ANNOTATION = 'io.rollbox.layers';
const WORKDIR_ANNOTATION = 'io.rollbox.workdir';
const CLASS_ANNOTATION = 'io.rollbox.class';
/** The sandbox's current stage policy (network, hidden paths), kept in its bundle for adoption. */
const POLICY_FILE = 'policy.json';
/** Top-level cgroup of every besteffort sandbox on the host (see besteffortParent). */
export const BESTEFFORT_ROOT = 'rollbox-besteffort';
const NO_NETWORK: NetworkPolicy = { mode: 'none', allow: [] };

function checkSandboxId(id: string): void {
  if (!SANDBOX_ID_RE.test(id) || id.includes('..')) {
    throw new RollboxError('invalid_request', `invalid sandbox id ${JSON.stringify(id).slice(0, 140)}`);
  }
}

const ENV_NAME_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;

function validateExec(spec: RuntimeExecSpec): void {
  const bad = (msg: string): never => {
    throw new RollboxError('invalid_request', msg);
  };
  if (spec.argv.length === 0 || spec.argv[0] === '') bad('argv must name a program');
  if (spec.argv.some((a) => a.includes('\0'))) bad('argv must not contain NUL');
  for (const [k, v] of Object.entries(spec.env)) {
    if (!ENV_NAME_RE.test(k)) bad(`invalid env name ${JSON.stringify(k).slice(0, 100)}`);
    if (v.includes('\0')) bad(`env ${k} contains NUL`);
  }
  if (spec.cwd !== undefined && (!spec.cwd.startsWith('/') || spec.cwd.includes('\0'))) bad('cwd must be an absolute path');
  if (!(spec.timeoutMs > 0) || !(spec.outputCapBytes >= 0)) bad('timeoutMs must be > 0 and outputCapBytes >= 0');
}

function validateCreate(spec: SandboxRuntimeSpec): void {
  const bad = (msg: string): never => {
    throw new RollboxError('invalid_request', msg);
  };
  if (spec.layerImages.length === 0) bad('a sandbox needs at least a base layer');
  for (const l of spec.layerImages) if (!/^sha256:[0-9a-f]{64}$/.test(l.digest) || !path.isAbsolute(l.imagePath)) bad(`invalid layer ${l.digest}`);
  const absolute = (p: string): boolean => p.startsWith('/') && !p.includes('\0');
  if (!absolute(spec.workdir)) bad('workdir must be an absolute path');
  if (!spec.hiddenPaths.every(absolute)) bad('hidden paths must be absolute');
  if (!Number.isInteger(spec.resources.diskMiB) || spec.resources.diskMiB < 1) bad('diskMiB must be a positive integer');
  for (const [k, v] of Object.entries(spec.env)) if (!ENV_NAME_RE.test(k) || v.includes('\0')) bad(`invalid env ${JSON.stringify(k).slice(0, 100)}`);
}

/**
 * When the command cannot be started, runc exits 255 with its own log line on stderr.
 * Report it the way a shell would (127 not found, 126 not executable) with a plain message.
 */
export function parseStartFailure(stderr: string): { exitCode: number; stderr: string } | undefined {
  const m = /^time="[^"]*" level=error msg="((?:[^"\\]|\\.)*)"\n?$/.exec(stderr);
  if (!m) return undefined;
  const msg = m[1]!.replace(/\\(.)/g, '$1');
  const detail = msg.replace(/^exec failed: unable to start container process: /, '');
  const exitCode = /executable file not found|no such file or directory/.test(detail) && detail.startsWith('exec:') ? 127 : /permission denied/.test(detail) && detail.startsWith('exec:') ? 126 : 255;
  return { exitCode, stderr: `rollbox: cannot start command: ${detail}\n` };
}

/** Collects up to `capBytes` of a stream and counts (but drops) the rest, so the writer never blocks. */
class CappedBuffer {
  private readonly chunks: Buffer[] = [];
  private kept = 0;
  truncated = false;
  constructor(
    private readonly capBytes: number,
    /** Sees every kept chunk as it arrives (streaming exec). */
    private readonly onKept?: (chunk: Buffer) => void,
  ) {}
  push(b: Buffer): void {
    const room = this.capBytes - this.kept;
    if (room <= 0) {
      if (b.length > 0) this.truncated = true;
      return;
    }
    const kept = b.length > room ? b.subarray(0, room) : b;
    if (b.length > room) this.truncated = true;
    this.chunks.push(kept);
    this.kept += kept.length;
    this.onKept?.(kept);
  }
  bytes(): Buffer {
    return Buffer.concat(this.chunks);
  }
  text(): string {
    return this.bytes().toString('utf8');
  }
}

/**
 * The runc-backed SandboxRuntime. Per sandbox: a bundle dir with a private overlay upper
 * dir over its layers (each EROFS image loop-mounted once per host by LayerMounts), a
 * generated config.json, and a container whose init is the host's static busybox sleeping
 * in `wait`. Containers live in `<dataDir>/runc`, cgroups under `/rollbox/<nodeId>/`.
 *
 * `reconcile` is meant for worker start and stop, when no create is in flight: it removes
 * every container of this runtime that is not in `keep`.
 */
export function createRuncRuntime(deps: RuncRuntimeDeps): RuncRuntime {
  if (!NODE_ID_RE.test(deps.nodeId)) throw new RollboxError('invalid_request', `invalid node id ${JSON.stringify(deps.nodeId)}`);
  const dataDir = path.resolve(deps.dataDir);
  // Paths end up inside overlayfs mount options, where ',' ':' and '\' are separators.
  if (/[,:\\\s]/.test(dataDir)) throw new RollboxError('invalid_request', `data dir ${dataDir} must not contain ',', ':', '\\' or whitespace`);
  const runcBin = deps.runtimeBinary ?? 'runc';
  const busyboxPath = deps.busyboxPath ?? '/bin/busybox';
  const umountBin = deps.umountBinary ?? 'umount';
  const chrtBin = deps.chrtBinary ?? 'chrt';
  const sandboxOomScoreAdj = deps.sandboxOomScoreAdj ?? 500;
  const execKillGraceMs = deps.execKillGraceMs ?? 2000;
  const runcRoot = path.join(dataDir, 'runc');
  const sandboxesDir = path.join(dataDir, 'sandboxes');
  const cgroupParent = `rollbox/${deps.nodeId}`;
  /**
   * Besteffort sandboxes live in their own top-level tree whose cpu cgroup has cpu.idle
   * set: next to the host's own tasks (this worker, the `runc exec` of a latency command)
   * the whole tree is SCHED_IDLE. Under `rollbox/` it would compete at full weight as part
   * of that parent (cgroup v1 does not pass a child's small weight up), and a latency
   * exec lost ~35% to busy besteffort neighbours (bench:interference).
   */
  const besteffortParent = `${BESTEFFORT_ROOT}/${deps.nodeId}`;
  const cgroupParents = [cgroupParent, besteffortParent];
  const log = deps.logger;
  const layerMounts = deps.layerMounts;
  const diskHelper = new DiskHelper({ perlBinary: deps.perlBinary });
  const scratch = new ScratchDisks({
    dataDir,
    helper: diskHelper,
    sizeGiB: deps.scratchSizeGiB,
    preallocate: deps.preallocateDisks,
    mkfsBinary: deps.mkfsBinary,
    losetupBinary: deps.losetupBinary,
    logger: log,
  });

  const sandboxes = new Map<string, SandboxRecord>();
  const locks = new Map<string, Promise<unknown>>();
  let cgroupsPromise: Promise<CgroupHierarchies> | undefined;
  let execSeq = 0;
  const execPrefix = `x${process.pid.toString(36)}`;
  let dirsReady: Promise<void> | undefined;

  let cgroupsFound: CgroupHierarchies | undefined;
  const cgroups = (): Promise<CgroupHierarchies> => (cgroupsPromise ??= discoverCgroups().then((found) => (cgroupsFound = found)));
  const besteffortQuotaFile = (id: string, cpu: string): string => path.join(cpu, cgroupRelOf(id, true), 'cpu.cfs_quota_us');
  const guard = new BesteffortGuard({
    maxHoldMs: deps.besteffortHoldMs ?? 0,
    heldQuotaUs: deps.besteffortHeldCpuMillis === undefined ? undefined : deps.besteffortHeldCpuMillis * (CPU_PERIOD_US / 1000),
    // Every besteffort sandbox got here through create or adopt, which found the hierarchies.
    quotaFiles: () => {
      const cpu = cgroupsFound?.cpu;
      return cpu ? [...sandboxes.values()].filter((r) => r.besteffort).map((r) => besteffortQuotaFile(r.id, cpu)) : [];
    },
    onError: (file, err) => log?.warn({ file, err: String(err) }, 'besteffort guard could not write a CPU quota'),
  });
  const ensureDirs = (): Promise<void> =>
    (dirsReady ??= Promise.all([mkdir(runcRoot, { recursive: true, mode: 0o700 }), mkdir(sandboxesDir, { recursive: true, mode: 0o700 })]).then(() => undefined));
  const containerIdOf = (id: string): string => `rb-${id}`;
  const bundleOf = (id: string): string => path.join(sandboxesDir, id);
  /** The sandbox's own filesystem (capped at diskMiB); the overlay's upper/ and work/ are in it. */
  const diskOf = (id: string): string => path.join(bundleOf(id), 'disk');
  const cgroupRelOf = (id: string, besteffort: boolean): string => `${besteffort ? besteffortParent : cgroupParent}/${containerIdOf(id)}`;
  /** The cgroup (same relative path in every v1 hierarchy) of a sandbox this runtime holds. */
  const cgroupRel = (id: string): string => cgroupRelOf(id, sandboxes.get(id)?.besteffort ?? false);
  const runcArgs = (...args: string[]): string[] => ['--root', runcRoot, ...args];
  const withClass = (besteffort: boolean, args: string[]): [string, string[]] => (besteffort ? [chrtBin, ['--idle', '0', runcBin, ...args]] : [runcBin, args]);

  /** The besteffort tree's top: idle in the cpu hierarchy before any sandbox runs in it. */
  async function ensureBesteffortRoot(): Promise<void> {
    const cpu = (await cgroups()).cpu;
    if (!cpu) return;
    const root = path.join(cpu, BESTEFFORT_ROOT);
    mkdirSync(root, { recursive: true });
    if (existsSync(path.join(root, 'cpu.idle'))) writeFileSync(path.join(root, 'cpu.idle'), '1');
  }

  /** Serialize create/destroy/adopt per sandbox id; exec does not take the lock. */
  async function locked<T>(id: string, fn: () => Promise<T>): Promise<T> {
    const prev = locks.get(id) ?? Promise.resolve();
    const run = prev.then(fn, fn);
    const tail = run.catch(() => undefined);
    locks.set(id, tail);
    try {
      return await run;
    } finally {
      if (locks.get(id) === tail) locks.delete(id);
    }
  }

  async function isRunningNow(id: string): Promise<boolean> {
    const state = await readRuncState(path.join(runcRoot, containerIdOf(id), 'state.json'));
    if (!state) return false;
    return isProcessAlive(state.init_process_pid, state.init_process_start);
  }

  async function unmountRootfs(rootfs: string): Promise<void> {
    if (!(await isMountPoint(rootfs))) return;
    for (let attempt = 0; attempt < 5; attempt++) {
      const r = await runQuiet(umountBin, [rootfs]);
      if (r.code === 0 || !(await isMountPoint(rootfs))) return;
      await sleep(20 * (attempt + 1));
    }
    log?.warn({ rootfs }, 'overlay still busy; detaching lazily');
    const r = await runQuiet(umountBin, ['-l', rootfs]);
    if (r.code !== 0 && (await isMountPoint(rootfs))) throw new RollboxError('internal', `cannot unmount ${rootfs}: ${r.stderr.trim()}`);
  }

  /**
   * Stop a container without runc: `runc delete --force` polls in 100 ms sleeps after its
   * SIGKILL, which would dominate destroy. We do what it does: freeze the container's
   * cgroup, SIGKILL every process in it, thaw, wait until it is empty.
   */
  async function killContainer(id: string): Promise<boolean> {
    const cg = await cgroups();
    const rel = cgroupRel(id);
    const other = cgroupRelOf(id, !(sandboxes.get(id)?.besteffort ?? false));
    // A leftover's class may be unknown: its cgroups may be in either tree.
    if (cg.all.some((h) => existsSync(path.join(h, other)))) await destroyCgroupTrees(cg.all.map((h) => path.join(h, other)), path.join(cg.freezer, other));
    return destroyCgroupTrees(
      cg.all.map((h) => path.join(h, rel)),
      path.join(cg.freezer, rel),
    );
  }

  /**
   * Remove everything of one sandbox: processes, cgroups, runc state, layer references
   * (only those this process holds, i.e. `rec.layers`), bundle. Every step tolerates
   * "already gone", so destroy is idempotent and also cleans half-created sandboxes.
   */
  async function teardown(id: string, rec: SandboxRecord | undefined): Promise<void> {
    const bundle = bundleOf(id);
    const stateDir = path.join(runcRoot, containerIdOf(id));
    if (!(await killContainer(id))) {
      // Something in the cgroup would not die (e.g. stuck in D state): let runc try.
      const r = await runQuiet(runcBin, runcArgs('delete', '--force', containerIdOf(id)));
      if (r.code !== 0 && !/does not exist/.test(r.stderr)) log?.warn({ sandboxId: id, stderr: r.stderr.trim() }, 'runc delete failed');
      if (!(await killContainer(id))) log?.warn({ sandboxId: id }, 'cgroups of sandbox could not be removed');
    }
    // Its network namespace went with the processes; the host side (veth lease, chain, DNS) goes here.
    await deps.network?.release(id);
    // With every process gone the container is stopped; its runc state is just files.
    await rm(stateDir, { recursive: true, force: true });
    // The overlay lived in the container's mount namespace and went with it; a rootfs
    // mounted on the host is a leftover of an older layout or a crash, unmount it.
    const rootfs = path.join(bundle, 'rootfs');
    await unmountRootfs(rootfs);
    if (rec) {
      sandboxes.delete(id);
      const held = rec.layers;
      rec.layers = [];
      // A layer that will not unmount yet stays mounted with no references; the next
      // release or reconcile retries. It must not fail the destroy of this sandbox.
      await Promise.all(
        held.map((l) => layerMounts.release(l.digest).catch((err: unknown) => log?.warn({ sandboxId: id, digest: l.digest, err: String(err) }, 'layer release failed'))),
      );
    }
    // Its disk: unmounted here (the overlay, gone with the container, held the other
    // reference), so the loop device detaches itself; then the image is deleted.
    await scratch.detach(id, diskOf(id));
    // Never rm -r through a live mount.
    if (await isMountPoint(rootfs)) throw new RollboxError('internal', `${rootfs} is still mounted`);
    await rm(bundle, { recursive: true, force: true });
  }

  async function acquireLayers(layers: { digest: string; imagePath: string }[], rec: SandboxRecord): Promise<void> {
    const results = await Promise.allSettled(layers.map((l) => layerMounts.acquire(l.digest, l.imagePath).then(() => l)));
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
  function lowerDirs(bundle: string, layers: { digest: string }[]): string[] {
    const dirs = [...layers].reverse().map((l) => layerMounts.dirOf(l.digest));
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
  async function restoreUpper(layer: { digest: string; imagePath: string }, upperDir: string): Promise<void> {
    const dir = await layerMounts.acquire(layer.digest, layer.imagePath);
    try {
      const r = await runQuiet('cp', ['-a', '--', `${dir}/.`, `${upperDir}/`]);
      if (r.code !== 0) throw new RollboxError('internal', `restoring the hibernated writable layer failed: ${r.stderr.trim().slice(0, 500)}`);
    } finally {
      await layerMounts.release(layer.digest);
    }
  }

  async function create(spec: SandboxRuntimeSpec): Promise<void> {
    const id = spec.sandboxId;
    checkSandboxId(id);
    validateCreate(spec);
    await ensureDirs();
    await locked(id, async () => {
      if (sandboxes.has(id) && (await isRunningNow(id))) return; // a retried create
      const cid = containerIdOf(id);
      const bundle = bundleOf(id);
      if (sandboxes.has(id) || existsSync(bundle) || existsSync(path.join(runcRoot, cid))) {
        await teardown(id, sandboxes.get(id)); // leftovers of a failed or dead attempt
      }
      // A layer listed twice would be rejected by overlayfs; keep its topmost position.
      const layers = spec.layerImages.filter((l, i) => !spec.layerImages.slice(i + 1).some((m) => m.digest === l.digest));
      const besteffort = spec.class === 'besteffort';
      const rec: SandboxRecord = { id, containerId: cid, bundle, layers: [], workdir: spec.workdir, besteffort };
      try {
        // Synchronous on purpose, here and below: each of these local-fs calls takes
        // microseconds, while a round trip through libuv's thread pool costs ~0.2-0.5 ms
        // and create's own overhead is meant to stay small.
        mkdirSync(bundle, { mode: 0o700 });
        for (const d of ['disk', 'rootfs']) mkdirSync(path.join(bundle, d));
        // The disk (copy, loop attach, mount: ~3-5 ms) overlaps mounting layers not yet mounted.
        const disk = diskOf(id);
        // allSettled: the cleanup below must not start while either is still running.
        const settled = await Promise.allSettled([acquireLayers(layers, rec), scratch.attach(id, spec.resources.diskMiB, disk)]);
        for (const r of settled) if (r.status === 'rejected') throw r.reason;
        if (spec.restoreUpper) await restoreUpper(spec.restoreUpper, path.join(disk, 'upper'));
        if (besteffort) await ensureBesteffortRoot();
        const lowerdirs = lowerDirs(bundle, layers);
        const config = containerConfig({
          hostname: cid.slice(0, 63),
          env: spec.env,
          workdir: spec.workdir,
          resources: spec.resources,
          class: spec.class,
          hiddenPaths: spec.hiddenPaths,
          cgroupsPath: `/${cgroupRelOf(id, besteffort)}`,
          busyboxPath,
          rootfs: { lowerdirs, upperdir: path.join(disk, 'upper'), workdir: path.join(disk, 'work') },
          oomScoreAdj: sandboxOomScoreAdj,
          limitSwap: (await cgroups()).memsw,
          seccomp: deps.seccomp ?? true,
          annotations: {
            'io.rollbox.sandbox': id,
            [LAYERS_ANNOTATION]: JSON.stringify(layers),
            [WORKDIR_ANNOTATION]: spec.workdir,
            [CLASS_ANNOTATION]: spec.class,
          },
        });
        writeFileSync(path.join(bundle, 'config.json'), JSON.stringify(config));
        const logFile = path.join(bundle, 'runc.log');
        // stdio is /dev/null: a detached container inherits runc's stdio, and a pipe held by
        // the init would never close. runc's errors go to its --log file instead.
        const [file, args] = withClass(besteffort, runcArgs('--log', logFile, '--log-format', 'json', 'run', '--detach', '--bundle', bundle, cid));
        const r = await runQuiet(file, args, { stdio: 'ignore-all' });
        if (r.code !== 0) throw new RollboxError('internal', `runc run failed: ${await lastRuncError(logFile)}`);
        // The init is tiny; keep it out of the way of the OOM killer relative to the commands
        // it hosts. Lowering it back from the config's positive value needs no
        // CAP_SYS_RESOURCE (which this host withholds) as long as we stay at or above the
        // worker's own value, hence 0 rather than -1000; best effort.
        // (The pid comes from runc's state.json; --pid-file measurably slows `runc run`.)
        const { init_process_pid: pid } = JSON.parse(readFileSync(path.join(runcRoot, cid, 'state.json'), 'utf8')) as { init_process_pid: number };
        try {
          writeFileSync(`/proc/${pid}/oom_score_adj`, '0');
        } catch {
          // not permitted below the worker's own floor: the init keeps the sandbox value
        }
        // cpu.idle (kernel >= 5.15, v1 too) on the sandbox's group as well: SCHED_IDLE
        // next to its besteffort siblings; its tasks' own SCHED_IDLE only orders them
        // against tasks of the same group. Best effort.
        const cpuHierarchy = (await cgroups()).cpu;
        const cpuIdleFile = cpuHierarchy && path.join(cpuHierarchy, cgroupRelOf(id, besteffort), 'cpu.idle');
        if (besteffort && cpuIdleFile && existsSync(cpuIdleFile)) writeFileSync(cpuIdleFile, '1');
        if (besteffort && cpuHierarchy) guard.started(besteffortQuotaFile(id, cpuHierarchy));
        // Before the sandbox is reported running (no command has run in it yet).
        const policy: SandboxPolicy = { network: spec.network ?? NO_NETWORK, hiddenPaths: spec.hiddenPaths };
        await applyNetwork(id, pid, policy.network);
        writeFileSync(path.join(bundle, POLICY_FILE), JSON.stringify(policy));
        sandboxes.set(id, rec);
      } catch (err) {
        await teardown(id, rec).catch((e: unknown) => log?.warn({ sandboxId: id, err: String(e) }, 'cleanup after failed create failed'));
        if (err instanceof RollboxError) throw err;
        throw new RollboxError('internal', `creating sandbox ${id} failed: ${err instanceof Error ? err.message : String(err)}`);
      }
    });
  }

  interface ExecRun {
    exitCode: number;
    stdout: CappedBuffer;
    stderr: CappedBuffer;
    timedOut: boolean;
    /** Stopped because stdout passed its cap (`stopAtStdoutCap`). */
    overflowed: boolean;
    oomKilled: boolean;
    durationMs: number;
  }

  /** One command in the sandbox through `runc exec`, in its own exec cgroup (see below). */
  async function runExec(
    sandboxId: string,
    spec: Omit<RuntimeExecSpec, 'stdin'> & { stdin?: string | Buffer; stderrCapBytes?: number; stopAtStdoutCap?: boolean },
  ): Promise<ExecRun> {
    checkSandboxId(sandboxId);
    const rec = sandboxes.get(sandboxId);
    if (!rec) throw new RollboxError('not_found', `sandbox ${sandboxId} is not on this host`);
    validateExec({ ...spec, stdin: undefined });
    const cg = await cgroups();
    const rel = cgroupRel(sandboxId);
    const memDir = path.join(cg.memory, rel);
    const pidsParent = path.join(cg.pids, rel);
    const freezerParent = path.join(cg.freezer, rel);
    // A per-exec child cgroup in pids and freezer: every process the command starts, even
    // backgrounded and re-parented to the init, stays in it, so a timeout can kill them all.
    const sub = `${execPrefix}-${(execSeq++).toString(36)}`;
    const pidsSub = path.join(pidsParent, sub);
    const freezerSub = path.join(freezerParent, sub);
    try {
      makeCgroup(pidsSub);
      makeCgroup(freezerSub);
    } catch (err) {
      removeCgroupTree(pidsSub);
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') throw new RollboxError('invalid_state', `sandbox ${sandboxId} is not running`);
      throw new RollboxError('internal', `exec cgroup: ${(err as Error).message}`);
    }
    // The sandbox-wide counter: with concurrent execs in one sandbox, an OOM kill is
    // reported by every exec that overlapped it (v1 has no per-exec counter short of a
    // per-exec memory cgroup, which would cost more than the rest of this hot path).
    const oomBefore = readOomKills(memDir);
    const args = ['--root', runcRoot, 'exec', '--cgroup', `freezer,pids:${sub}`, '--cwd', spec.cwd ?? rec.workdir];
    for (const kv of envList(spec.env)) args.push('--env', kv);
    args.push(rec.containerId, ...spec.argv);
    const [file, fileArgs] = withClass(rec.besteffort, args);

    const started = performance.now();
    const stdout = new CappedBuffer(spec.outputCapBytes, spec.onOutput && ((chunk) => spec.onOutput!('stdout', chunk)));
    const stderr = new CappedBuffer(spec.stderrCapBytes ?? spec.outputCapBytes, spec.onOutput && ((chunk) => spec.onOutput!('stderr', chunk)));
    let timedOut = false;
    let overflowed = false;
    let exitCode: number;
    let killer: NodeJS.Timeout | undefined;
    try {
      exitCode = await new Promise<number>((resolve, reject) => {
        const child = spawn(file, fileArgs, { stdio: [spec.stdin !== undefined ? 'pipe' : 'ignore', 'pipe', 'pipe'] });
        let stopping = false;
        // Kill the exec cgroup's processes, and again every 20 ms until runc returns: a
        // process that had not joined the cgroup yet (a very short timeout) is caught on
        // a later round. If runc itself does not return, stop it too.
        const stop = (): void => {
          if (stopping) return;
          stopping = true;
          const killedAt = Date.now();
          const round = (): void => {
            void killCgroup(pidsSub, freezerSub, 100).finally(() => {
              if (child.exitCode !== null || child.signalCode !== null) return;
              if (Date.now() - killedAt > execKillGraceMs) {
                child.kill('SIGKILL');
                child.stdout?.destroy();
                child.stderr?.destroy();
                return;
              }
              killer = setTimeout(round, 20);
            });
          };
          round();
        };
        child.stdout!.on('data', (b: Buffer) => {
          stdout.push(b);
          if (spec.stopAtStdoutCap && stdout.truncated && !overflowed) {
            overflowed = true;
            stop();
          }
        });
        child.stderr!.on('data', (b: Buffer) => stderr.push(b));
        if (spec.stdin !== undefined && child.stdin) {
          child.stdin.on('error', () => undefined); // the command may exit without reading (EPIPE)
          child.stdin.end(spec.stdin);
        }
        const timer = setTimeout(() => {
          timedOut = true;
          stop();
        }, spec.timeoutMs);
        child.on('error', (e) => {
          clearTimeout(timer);
          reject(new RollboxError('internal', `${file}: ${e.message}`));
        });
        child.on('close', (code, signal) => {
          clearTimeout(timer);
          resolve(code ?? 128 + (signal === 'SIGKILL' ? 9 : 15));
        });
      });
    } finally {
      if (killer) clearTimeout(killer);
    }
    const durationMs = performance.now() - started;

    // Whatever is left in the exec cgroup detached from its output (a daemon started with
    // `cmd >log 2>&1 &`): it outlives this exec unless the exec was stopped.
    if (readProcs(pidsSub).length > 0 || readProcs(freezerSub).length > 0) {
      if (timedOut || overflowed) await killCgroup(pidsSub, freezerSub);
      else {
        migrateProcs(pidsSub, pidsParent);
        migrateProcs(freezerSub, freezerParent);
      }
    }
    if (!removeCgroupTree(pidsSub) || !removeCgroupTree(freezerSub)) void retireExecCgroup(pidsSub, freezerSub, pidsParent, freezerParent);
    const oomKilled = readOomKills(memDir) > oomBefore;
    return { exitCode, stdout, stderr, timedOut, overflowed, oomKilled, durationMs: Math.round(durationMs * 1000) / 1000 };
  }

  async function exec(sandboxId: string, spec: RuntimeExecSpec): Promise<RuntimeExecOutcome> {
    const release = spec.holdBackBesteffort && sandboxes.get(sandboxId)?.besteffort === false ? guard.hold() : undefined;
    const run = await runExec(sandboxId, spec).finally(() => release?.());
    const startFailure = run.exitCode === 255 ? parseStartFailure(run.stderr.text()) : undefined;
    return {
      exitCode: startFailure?.exitCode ?? run.exitCode,
      stdout: run.stdout.text(),
      stderr: startFailure?.stderr ?? run.stderr.text(),
      truncated: run.stdout.truncated || run.stderr.truncated,
      timedOut: run.timedOut,
      oomKilled: run.oomKilled,
      durationMs: run.durationMs,
    };
  }

  async function execRaw(sandboxId: string, spec: RuntimeRawExecSpec): Promise<RuntimeRawExecOutcome> {
    const run = await runExec(sandboxId, {
      argv: spec.argv,
      stdin: spec.stdin,
      env: {},
      cwd: '/', // the sandbox's workdir may be gone
      timeoutMs: spec.timeoutMs,
      // Kept up to the cap; one byte more marks it truncated and stops the command.
      outputCapBytes: spec.maxStdoutBytes,
      stderrCapBytes: 64 * 1024,
      stopAtStdoutCap: true,
    });
    return { exitCode: run.exitCode, stdout: run.stdout.bytes(), stderr: run.stderr.text(), overflowed: run.overflowed, timedOut: run.timedOut };
  }

  /** Off the hot path: a process forking while it was migrated can keep a child cgroup busy briefly. */
  async function retireExecCgroup(pidsSub: string, freezerSub: string, pidsParent: string, freezerParent: string): Promise<void> {
    for (let i = 0; i < 20; i++) {
      await sleep(10 * (i + 1));
      migrateProcs(pidsSub, pidsParent);
      migrateProcs(freezerSub, freezerParent);
      if (removeCgroupTree(pidsSub) && removeCgroupTree(freezerSub)) return;
    }
    log?.warn({ pidsSub }, 'exec cgroup could not be removed');
  }

  async function destroy(sandboxId: string): Promise<void> {
    checkSandboxId(sandboxId);
    await ensureDirs();
    await locked(sandboxId, () => teardown(sandboxId, sandboxes.get(sandboxId)));
  }

  async function isRunning(sandboxId: string): Promise<boolean> {
    checkSandboxId(sandboxId);
    return isRunningNow(sandboxId);
  }

  async function oomKillCount(sandboxId: string): Promise<number> {
    checkSandboxId(sandboxId);
    const cg = await cgroups();
    return readOomKills(path.join(cg.memory, cgroupRel(sandboxId)));
  }

  /** Take over a live container left by a previous worker process. */
  async function adopt(id: string): Promise<boolean> {
    const bundle = bundleOf(id);
    let config: { annotations?: Record<string, string>; linux?: { resources?: { cpu?: { quota?: number } } } };
    try {
      config = JSON.parse(await readFile(path.join(bundle, 'config.json'), 'utf8')) as typeof config;
    } catch {
      return false;
    }
    const ann = config.annotations ?? {};
    const layers = JSON.parse(ann[LAYERS_ANNOTATION] ?? '[]') as { digest: string; imagePath: string }[];
    const rec: SandboxRecord = {
      id,
      containerId: containerIdOf(id),
      bundle,
      layers: [],
      workdir: ann[WORKDIR_ANNOTATION] ?? '/',
      besteffort: ann[CLASS_ANNOTATION] === 'besteffort',
    };
    try {
      await acquireLayers(layers, rec);
    } catch (err) {
      await Promise.all(rec.layers.map((l) => layerMounts.release(l.digest)));
      log?.warn({ sandboxId: id, err: String(err) }, 'cannot adopt sandbox: its layers are not mountable');
      return false;
    }
    // Exec cgroups of commands whose worker died: nobody will collect their results.
    const cg = await cgroups();
    for (const h of cg.all) {
      const dir = path.join(h, cgroupRelOf(id, rec.besteffort));
      const subs = await readdir(dir, { withFileTypes: true }).catch(() => []);
      for (const s of subs) {
        if (!s.isDirectory()) continue;
        await killCgroup(path.join(dir, s.name), h === cg.freezer ? path.join(dir, s.name) : undefined);
        removeCgroupTree(path.join(dir, s.name));
      }
    }
    // A worker that died while its guard held besteffort sandboxes back left them capped.
    if (rec.besteffort && cg.cpu) {
      try {
        writeFileSync(besteffortQuotaFile(id, cg.cpu), String(config.linux?.resources?.cpu?.quota ?? -1));
      } catch (err) {
        log?.warn({ sandboxId: id, err: String(err) }, 'could not restore the CPU quota of an adopted besteffort sandbox');
      }
    }
    sandboxes.set(id, rec);
    return true;
  }

  async function reconcile(keep: ReadonlySet<string>): Promise<{ adopted: string[]; removed: string[]; missing: string[] }> {
    await ensureDirs();
    const cg = await cgroups();
    const adopted = new Set<string>();
    const removed = new Set<string>();
    const idOfContainer = (name: string): string | undefined => {
      if (!name.startsWith('rb-')) return undefined;
      const id = name.slice(3);
      return SANDBOX_ID_RE.test(id) && !id.includes('..') ? id : undefined;
    };
    const removeOne = async (id: string): Promise<void> => {
      await locked(id, () => teardown(id, sandboxes.get(id)));
      removed.add(id);
    };

    // 1. Containers in our runc root.
    for (const name of await readdir(runcRoot).catch(() => [] as string[])) {
      const id = idOfContainer(name);
      if (!id) continue;
      const keepIt = keep.has(id) && (await locked(id, async () => (await isRunningNow(id)) && (sandboxes.has(id) || (await adopt(id)))));
      if (keepIt) adopted.add(id);
      else await removeOne(id);
    }
    // 2. Records and bundles without a live container.
    for (const id of [...sandboxes.keys()]) if (!adopted.has(id)) await removeOne(id);
    for (const name of await readdir(sandboxesDir).catch(() => [] as string[])) {
      if (adopted.has(name)) continue;
      if (SANDBOX_ID_RE.test(name) && !name.includes('..')) await removeOne(name);
      else log?.warn({ name }, 'unexpected entry in sandboxes dir left alone');
    }
    // Network: adopted sandboxes get their rules and DNS responder back, the rest their host side removed.
    if (deps.network) {
      const live = new Map<string, { pid: number; policy: NetworkPolicy }>();
      for (const id of adopted) {
        const pid = await initPidOf(id).catch(() => undefined);
        if (pid) live.set(id, { pid, policy: (await readPolicy(id).catch(() => undefined))?.network ?? NO_NETWORK });
      }
      await deps.network.reconcile(live);
    }
    // 3. Overlay mounts under our sandboxes dir that no bundle accounted for.
    for (const m of await readMountInfo()) {
      if (!m.mountPoint.startsWith(`${sandboxesDir}/`)) continue;
      const id = m.mountPoint.slice(sandboxesDir.length + 1).split('/')[0]!;
      if (adopted.has(id)) continue;
      await unmountRootfs(m.mountPoint);
    }
    // 4. Cgroups under our parent that belong to no adopted sandbox.
    for (const h of cg.all) {
      for (const parent of cgroupParents.map((p) => path.join(h, p))) {
        for (const e of await readdir(parent, { withFileTypes: true }).catch(() => [])) {
          if (!e.isDirectory()) continue;
          const id = idOfContainer(e.name);
          if (id && adopted.has(id)) continue;
          await destroyCgroupTrees([path.join(parent, e.name)], h === cg.freezer ? path.join(parent, e.name) : undefined);
          if (id) removed.add(id);
        }
      }
    }
    // 5. Layer mounts no adopted sandbox uses (and their loop devices).
    const inUse = new Set<string>();
    for (const id of adopted) for (const l of sandboxes.get(id)?.layers ?? []) inUse.add(l.digest);
    await layerMounts.reconcile(inUse);
    // 6. Disk images without a sandbox; with no sandbox left, the scratch filesystem itself.
    scratch.removeStrayImages(adopted, await readdir(scratch.disksDir).catch(() => [] as string[]));
    if (adopted.size === 0) {
      await scratch.teardown();
      diskHelper.close();
      for (const h of cg.all) {
        // A just-emptied child cgroup can keep its parent busy for a moment (memcg offlining).
        for (const parent of cgroupParents) for (let tries = 0; !removeCgroupTree(path.join(h, parent)) && tries < 40; tries++) await sleep(25);
        // Shared by every node id on the host: only go when empty.
        for (const root of ['rollbox', BESTEFFORT_ROOT]) await rmdir(path.join(h, root)).catch(() => undefined);
      }
    }
    return { adopted: [...adopted], removed: [...removed], missing: [...keep].filter((id) => !adopted.has(id)) };
  }

  /**
   * Freeze or thaw every process of the sandbox with the cgroup freezer: CPU time stops
   * advancing while memory, files and processes stay. Written directly (as `runc pause`
   * does, and runc reads its status from the same file) to save a runc process per call.
   */
  async function setFrozen(id: string, frozen: boolean): Promise<void> {
    const stateFile = path.join((await cgroups()).freezer, cgroupRel(id), 'freezer.state');
    if (!existsSync(stateFile)) throw new RollboxError('not_found', `sandbox ${id} has no freezer cgroup on this host`);
    await setFreezerState(stateFile, frozen ? 'FROZEN' : 'THAWED');
  }

  async function initPidOf(id: string): Promise<number> {
    const state = await readRuncState(path.join(runcRoot, containerIdOf(id), 'state.json'));
    if (!state || !(await isProcessAlive(state.init_process_pid, state.init_process_start))) throw new RollboxError('invalid_state', `sandbox ${id} is not running`);
    return state.init_process_pid;
  }

  async function readPolicy(id: string): Promise<SandboxPolicy> {
    const stored = await readFile(path.join(bundleOf(id), POLICY_FILE), 'utf8').catch(() => '');
    if (stored) return JSON.parse(stored) as SandboxPolicy;
    // A sandbox from before stage changes existed: its create-time hidden paths.
    const ann = (JSON.parse(await readFile(path.join(bundleOf(id), 'config.json'), 'utf8')) as { linux?: { maskedPaths?: string[] } }).linux?.maskedPaths ?? [];
    return { network: NO_NETWORK, hiddenPaths: ann.filter((p) => !(MASKED_PATHS as readonly string[]).includes(p)) };
  }

  /** Network rules, then the sandbox's resolv.conf pointing at the platform's resolver. */
  async function applyNetwork(id: string, pid: number, network: NetworkPolicy): Promise<void> {
    if (network.mode === 'allowlist' && !deps.network) throw new RollboxError('invalid_request', 'network mode allowlist is not available on this worker host');
    if (!deps.network) return;
    await deps.network.apply(id, pid, network);
    const resolver = deps.network.resolverOf(id);
    // Best effort: an agent that replaced its resolv.conf with something else only loses DNS.
    if (resolver) {
      await inMountNamespace(pid, [{ op: 'write', path: '/etc/resolv.conf' }], `nameserver ${resolver}\n`, deps.perlBinary).catch((err: unknown) =>
        log?.warn({ sandboxId: id, err: String(err) }, 'could not point resolv.conf at the platform resolver'),
      );
    }
  }

  /**
   * A task stage change: the network policy is replaced atomically, then paths are hidden
   * or revealed inside the running sandbox, with its processes frozen so nothing races the
   * change. Only paths rollbox hid are ever revealed (runc's masked defaults never are).
   */
  async function applyPolicy(id: string, change: Partial<SandboxPolicy>): Promise<SandboxPolicy> {
    checkSandboxId(id);
    if (!sandboxes.has(id)) throw new RollboxError('not_found', `sandbox ${id} is not on this host`);
    return locked(id, async () => {
      const pid = await initPidOf(id);
      const current = await readPolicy(id);
      // `/grader/` and `/grader` are one mount point.
      const normalized = change.hiddenPaths?.map((p) => path.posix.normalize(p).replace(/(.)\/$/, '$1'));
      const next: SandboxPolicy = { network: change.network ?? current.network, hiddenPaths: [...new Set(normalized ?? current.hiddenPaths)] };
      if (!next.hiddenPaths.every((p) => p.startsWith('/') && !p.includes('\0'))) throw new RollboxError('invalid_request', 'hidden paths must be absolute');
      // Hidden paths first: their failures come from the request (a symlink), and then
      // nothing changed. Should the network part fail after them (e.g. a name that does not
      // resolve), they are changed back: a stage change applies whole or not at all.
      await changeHiddenPaths(id, pid, current.hiddenPaths, next.hiddenPaths);
      if (change.network) {
        try {
          await applyNetwork(id, pid, next.network);
        } catch (err) {
          await changeHiddenPaths(id, pid, next.hiddenPaths, current.hiddenPaths).catch((undoErr: unknown) =>
            log?.warn({ sandboxId: id, err: String(undoErr) }, 'could not restore hidden paths after a failed stage change'),
          );
          throw err;
        }
      }
      writeFileSync(path.join(bundleOf(id), POLICY_FILE), JSON.stringify(next));
      return next;
    });
  }

  /** Hide and reveal inside the running sandbox, its processes frozen meanwhile. */
  async function changeHiddenPaths(id: string, pid: number, from: readonly string[], to: readonly string[]): Promise<void> {
    // Only rollbox-hidden paths are ever revealed, never runc's masked defaults.
    const reveal = from.filter((p) => !to.includes(p) && !(MASKED_PATHS as readonly string[]).includes(p));
    const hide = to.filter((p) => !from.includes(p));
    if (!reveal.length && !hide.length) return;
    const stateFile = path.join((await cgroups()).freezer, cgroupRel(id), 'freezer.state');
    const wasFrozen = (await readFile(stateFile, 'utf8')).trim() === 'FROZEN';
    if (!wasFrozen) await setFreezerState(stateFile, 'FROZEN');
    try {
      // Reveal only what is a mount point at exactly that path (what we or runc mounted).
      const mounted = await mountPointsOf(pid);
      const ops: MountNsOp[] = [...reveal.filter((p) => mounted.has(p)).map((p) => ({ op: 'reveal' as const, path: p })), ...hide.map((p) => ({ op: 'hide' as const, path: p }))];
      await inMountNamespace(pid, ops, '', deps.perlBinary);
    } finally {
      if (!wasFrozen) await setFreezerState(stateFile, 'THAWED');
    }
  }

  return {
    runcRoot,
    sandboxesDir,
    scratchDir: scratch.mountPoint,
    cgroupParent,
    containerIdOf,
    create,
    exec,
    execRaw,
    destroy,
    snapshot: async (id: string, options: { outPath: string; excludePaths: readonly string[] }) =>
      packUpperDir({
        upperDir: await upperDirOfBundle(bundleOf(id)),
        freezerStateFile: path.join((await cgroups()).freezer, cgroupRel(id), 'freezer.state'),
        ...options,
      }),
    applyPolicy,
    pause: (id: string) => setFrozen(id, true),
    resume: (id: string) => setFrozen(id, false),
    isRunning,
    oomKillCount,
    reconcile,
    mountedLayers: () => layerMounts.mounted(),
    diskSpace: () => ({ ...scratch.space(), preallocated: deps.preallocateDisks ?? false }),
  };
}
