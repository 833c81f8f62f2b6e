import type { FailureReason, NetworkPolicy, Resources, RuntimeMetrics, SandboxClass, SandboxTier } from '../../api/index.ts';
import type { LayerFiles } from '../../layers/index.ts';

/** What the runtime needs to start one sandbox on this host. */
export interface SandboxRuntimeSpec {
  sandboxId: string;
  /** Which runtime runs it (tiered.ts); default container. */
  tier?: SandboxTier;
  /** The sandbox's layers on this host (absolute paths), base first. */
  layerImages: LayerFiles[];
  resources: Resources;
  class: SandboxClass;
  env: Record<string, string>;
  workdir: string;
  /** Who commands run as when an exec names nobody (an image's User); none: root. */
  user?: string;
  hiddenPaths: string[];
  /**
   * A packed writable layer (hibernation) whose contents, whiteouts and opaque dirs
   * included, are copied into the new upper dir before the container starts.
   */
  restoreUpper?: LayerFiles;
  /**
   * A fork's child on its fork point's host: its disk starts as a clone of that fork point
   * (the parent's writable layer as of the fork; resources.diskMiB is the parent's).
   */
  forkPoint?: string;
  /** A sandbox saved whole (hibernateWhole): the image directory it comes back from, processes and all. */
  restoreWhole?: string;
  /**
   * A fork's child that keeps its parent's processes: the fork's image (forkWhole) it is
   * restored from, then given its own name, clock, entropy and network; the image stays (other
   * children read it too).
   */
  restoreFork?: string;
  /** Setuid programs may raise privileges (no no_new_privs); default false. */
  allowPrivilegeEscalation?: boolean;
  /** Default: mode none (loopback only). */
  network?: NetworkPolicy;
  /**
   * A warm pool's refill: runc (and so the init) under SCHED_IDLE, so starting it never
   * slows running work; a latency sandbox leaves SCHED_IDLE when it is claimed.
   */
  lowPriority?: boolean;
}

/** What a claim binds to a ready sandbox of a warm pool (see claim.ts). */
export interface SandboxBinding {
  resources: Resources;
  env: Record<string, string>;
  workdir: string;
  user?: string;
  hiddenPaths: string[];
  network?: NetworkPolicy;
}

/** What a task stage sets: the sandbox's network policy and the paths hidden from it. */
export interface SandboxPolicy {
  network: NetworkPolicy;
  hiddenPaths: string[];
}

/** What a snapshot wrote. */
export interface RuntimeSnapshot {
  frozenMs: number;
  /**
   * Not one image at `outPath` but a split layer (metadata image + data blob, and its
   * chunk table: LayerStore.putSplit), as a microVM's snapshot is read from its guest's stream.
   */
  split?: { metaPath: string; blobPath: string; chunkSizeBytes: number; table: Buffer };
}

export interface RuntimeExecSpec {
  argv: string[];
  stdin?: string;
  env: Record<string, string>;
  cwd?: string;
  /** `name`, `uid`, `name:group` or `uid:gid`, resolved by the init against the sandbox's /etc/passwd and /etc/group; none: the sandbox's user, else root. */
  user?: string;
  timeoutMs: number;
  /** Bytes kept per stream; the rest is drained and dropped (truncated = true). */
  outputCapBytes: number;
  /** Called with each kept chunk as the command produces it, in order per stream. */
  onOutput?: (stream: 'stdout' | 'stderr', chunk: Buffer) => void;
  /** A caller waits on it: in a latency sandbox it holds besteffort sandboxes back while it runs (besteffort-guard.ts). */
  holdBackBesteffort?: boolean;
  /**
   * The command outlives this worker process for `graceMs` (rollbox-init.c: durable
   * commands), addressable by `commandId` for attach, signalCommand and writeCommandStdin.
   */
  durable?: { commandId: string; graceMs: number };
  /** Stdin stays open for writeCommandStdin until it is closed (after `stdin`, if any). */
  keepStdinOpen?: boolean;
  /**
   * Run on a pseudo-terminal of this size, allocated by the sandbox's init: its output is
   * one stream (stdout) and its stdin stays open; resizeCommand changes its size. The
   * outcome's stdout is the output's last PTY_RESULT_TAIL_BYTES.
   */
  pty?: { cols: number; rows: number };
  /**
   * A durable command's result, recorded before the init may drop it (a worker that dies
   * before it finishes leaves the result to the next one's attach).
   */
  record?: (outcome: RuntimeExecOutcome) => Promise<void>;
}

/** A durable command a previous worker process started, collected from the init. */
export interface RuntimeAttachSpec {
  commandId: string;
  /** What is left of its timeout; past it the command is killed as an exec's would be. */
  timeoutMs: number;
  /** Called with each chunk of its output, from the first byte it wrote, in order per stream. */
  onOutput?: (stream: 'stdout' | 'stderr', chunk: Buffer) => void;
  record?: (outcome: RuntimeExecOutcome) => Promise<void>;
}


/** A command with binary stdin and stdout (the files API): stdout is kept as bytes. */
export interface RuntimeRawExecSpec {
  argv: string[];
  stdin?: Buffer;
  timeoutMs: number;
  /** Past this many stdout bytes the command is killed and `overflowed` is set. */
  maxStdoutBytes: number;
}

export interface RuntimeRawExecOutcome {
  exitCode: number;
  stdout: Buffer;
  /** At most 64 KiB of it. */
  stderr: string;
  overflowed: boolean;
  timedOut: boolean;
}

export interface RuntimeExecOutcome {
  exitCode: number;
  stdout: string;
  stderr: string;
  truncated: boolean;
  timedOut: boolean;
  /** The OOM killer took a process of this command (counted in its own exec cgroup). */
  oomKilled: boolean;
  /** How many of its processes it took. */
  oomKills: number;
  durationMs: number;
}

/** Why a sandbox's init is gone, as far as its runtime can tell: its record's failure reason and detail. */
export interface SandboxExit {
  reason: Extract<FailureReason, 'oom' | 'init_lost' | 'guest_panic'>;
  detail: string;
}

/**
 * The container runtime behind a worker host, chosen once (runc today). Every method is
 * idempotent by sandbox id so a retried queue job or a restarted worker can call it again.
 */
export interface SandboxRuntime {
  /** Mount layers + overlay, write the bundle, start the container. */
  create(spec: SandboxRuntimeSpec): Promise<void>;
  exec(sandboxId: string, spec: RuntimeExecSpec): Promise<RuntimeExecOutcome>;
  /** A durable command of a previous worker process: its whole output and outcome; undefined when the init does not hold it. */
  attach(sandboxId: string, spec: RuntimeAttachSpec): Promise<RuntimeExecOutcome | undefined>;
  /** A signal to a running durable command's process group; false when none of that id runs here. */
  signalCommand(sandboxId: string, commandId: string, signo: number): Promise<boolean>;
  /** Stdin for a running durable command started with stdin open; false when none of that id takes it here. */
  writeCommandStdin(sandboxId: string, commandId: string, data: Buffer, eof: boolean): Promise<boolean>;
  /** A running pty command's window size (SIGWINCH to its foreground group); false when no pty command of that id runs here. */
  resizeCommand(sandboxId: string, commandId: string, size: { cols: number; rows: number }): Promise<boolean>;
  /** Like exec, inside the sandbox (its namespaces, cgroups, seccomp), with bytes in and out. */
  execRaw(sandboxId: string, spec: RuntimeRawExecSpec): Promise<RuntimeRawExecOutcome>;
  /** A ready sandbox of a warm pool takes the identity of a create: limits, env, workdir, hidden paths, network. */
  claim(sandboxId: string, binding: SandboxBinding): Promise<void>;
  /** Stop and remove everything of the sandbox on this host. Safe to call twice. */
  destroy(sandboxId: string): Promise<void>;
  /** A task stage change in a running (or paused) sandbox; returns the policy now in force. */
  applyPolicy(sandboxId: string, change: Partial<SandboxPolicy>): Promise<SandboxPolicy>;
  /** Freeze every process of the sandbox (cgroup freezer): CPU stops, memory and processes stay. */
  pause(sandboxId: string): Promise<void>;
  /**
   * Pause mode `swap`: frozen (if it was not), then its memory paged out to the host's swap
   * file, processes kept; refused `swap_unavailable` (the sandbox as it was) without room
   * there. Answers what it holds afterwards.
   */
  swapOut(sandboxId: string): Promise<{ residentBytes: number; swappedBytes: number }>;
  /**
   * What this runtime's sandboxes hold together in the host's memory and in swap (their
   * cgroups' totals); a microVM runtime also answers the guest RAM the host does not back
   * for its VMs that hand memory back (`guestUnbackedBytes`, docs/microvm.md).
   */
  memoryHeld(): Promise<{ residentBytes: number; swappedBytes: number; guestUnbackedBytes?: number }>;
  /** Thaw; memory a swap pause paged out is read back first. */
  resume(sandboxId: string): Promise<void>;
  /**
   * pack_diff: write the sandbox's writable layer (its overlay upper dir, whiteouts and
   * opaque dirs included) as an EROFS image at `outPath` (or a split layer: `split`),
   * leaving out `excludePaths` (absolute paths inside the sandbox), as of one moment: the
   * sandbox is frozen for it (a container on a host that clones disks: only while its disk
   * is cloned); `frozenMs` says how long (0: it was paused already).
   */
  snapshot(sandboxId: string, options: { outPath: string; excludePaths: readonly string[] }): Promise<RuntimeSnapshot>;
  /**
   * A fork point of a running or paused sandbox: its disk as of now, the sandbox frozen only
   * while the disk is cloned (fork-point.ts). undefined where this host cannot clone disks
   * (the caller packs the writable layer with `snapshot` instead).
   */
  makeForkPoint(sandboxId: string, forkPointId: string): Promise<{ frozenMs: number } | undefined>;
  /** A fork point's writable layer as an EROFS image at `outPath` (for children on other hosts). */
  packForkPoint(forkPointId: string, outPath: string): Promise<void>;
  /** Safe to call twice; a fork point nobody removes goes by itself after a while. */
  removeForkPoint(forkPointId: string): void;
  /**
   * Whether this sandbox hibernates whole, keeping its processes (a microVM: memory and
   * device state saved, hibernateWhole), rather than as its packed writable layer.
   */
  hibernatesWhole(sandboxId: string): boolean;
  /**
   * Save the sandbox whole into `imageDir` (whole or absent), then remove it from this
   * host; a create with `restoreWhole: imageDir` brings it back as it was. On failure the
   * sandbox runs on. Commands running in it are not ended: `carriedCommands` (durable
   * command ids) run on in the saved image, and the host that wakes it attaches to them
   * (their connections here end in CommandReleasedError).
   */
  hibernateWhole(sandboxId: string, imageDir: string): Promise<{ carriedCommands: string[] }>;
  /**
   * A fork that keeps processes, of a sandbox that hibernatesWhole: saved whole into
   * `imageDir` (whole or absent) as hibernateWhole saves it, the sandbox running on (a paused
   * one stays paused). `frozenMs`: how long it was stopped; `detachedCommands`: the commands
   * running in it now, whose processes each child keeps, detached. `children.nic`: the
   * children want a network device (refused, before anything is saved, if it has none).
   */
  forkWhole(sandboxId: string, imageDir: string, children: { nic: boolean }): Promise<{ frozenMs: number; detachedCommands: string[] }>;
  /** Whether the sandbox's init process is alive. */
  isRunning(sandboxId: string): Promise<boolean>;
  /**
   * The host's listener for sandboxes whose init died while this runtime did not stop it
   * (killed from the host, the OOM killer): told by an event soon after the death, not by
   * polling. One listener; a later call replaces it.
   */
  onExit(listener: (sandboxId: string) => void): void;
  /**
   * This process lets go of its sandboxes without stopping them (a worker host that stops
   * and leaves them to the next start): no more exit events, no watch held.
   */
  detach(): void;
  /**
   * OOM kills in the sandbox's own memory cgroup: its init, and processes commands left
   * running (those of running commands count in the command's outcome instead).
   */
  oomKillCount(sandboxId: string): Promise<number>;
  /**
   * Why the sandbox's init died, asked once isRunning said it did (before destroy): `oom`
   * when the OOM killer took it (or, in a microVM, left its guest kernel nothing to kill),
   * `guest_panic` when a microVM's guest kernel panicked, else `init_lost`.
   */
  exitCause(sandboxId: string): Promise<SandboxExit>;
  /**
   * Make the host match `keep`: sandboxes in `keep` that still run are adopted; every other
   * container, overlay mount, layer mount, loop device and upper dir of this runtime is removed.
   */
  reconcile(keep: ReadonlySet<string>): Promise<{ adopted: string[]; removed: string[]; missing: string[] }>;
  /** Digests of layers currently mounted on this host. */
  mountedLayers(): string[];
  /** Sandboxes (ids) that use any of these layers. */
  sandboxesUsingLayers(digests: ReadonlySet<string>): string[];
  /** Unmount these layers now if no sandbox uses them (instead of after the idle delay). */
  unmountUnused(digests: readonly string[]): Promise<void>;
  /**
   * The host space sandbox disks (diskMiB) live in, MiB, and whether each disk reserves its
   * whole size there (then it cannot be overcommitted).
   */
  diskSpace(): { sizeMiB: number; freeMiB: number; preallocated: boolean };
  /** One sample of the sandbox's resource use (CPU over a window, memory and disk now), from its cgroups and disk. */
  metrics(sandboxId: string): Promise<RuntimeMetrics>;
  /** A process in the sandbox's network namespace (its init), for connections into its ports (src/ports). */
  netnsPidOf(sandboxId: string): Promise<number>;
}
