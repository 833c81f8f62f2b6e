import { performance } from 'node:perf_hooks';
import { RollboxError } from '../../api/index.ts';
import { AUTO_SLOT, InitLostError, openCommand, type CommandChannel, type CommandStart } from '../init/index.ts';
import { CommandReleasedError, type RuntimeAttachSpec, type RuntimeExecOutcome, type RuntimeExecSpec, type RuntimeRawExecOutcome, type RuntimeRawExecSpec } from '../runtime/index.ts';

/**
 * A durable command whose connection this process holds or is opening (listed from the
 * start, so a signal or stdin sent meanwhile waits for `opened`).
 */
export interface LiveVmCommand {
  /** Its connection once the init took it; undefined if it never did. */
  opened: Promise<CommandChannel | undefined>;
  stdinOpen: boolean;
  /**
   * Let go of (the VM hibernated with it running): the connection's end is not the
   * command's; it runs on in the saved guest, for the host that wakes it to attach to.
   */
  released: boolean;
}

/** What exec needs of a running microVM. */
export interface VmCommandTarget {
  sandboxId: string;
  initSocket: string;
  env: Record<string, string>;
  workdir: string;
  user?: string;
  /** Durable commands whose connection this process holds (signal, stdin by command id). */
  live: Map<string, LiveVmCommand>;
}

/** After a timeout's SIGKILL, how long the init may take to report the exit before the connection is dropped. */
const KILL_GRACE_MS = 2000;

interface Run {
  exitCode: number;
  stdout: Buffer[];
  stderr: Buffer[];
  truncated: boolean;
  timedOut: boolean;
  overflowed: boolean;
  /** Counted by the guest's init in the command's exec cgroup (a cgroup2 the sandbox cannot reach). */
  oomKills: number;
  durationMs: number;
}

/**
 * One command through the guest's rollbox-init, over the VM's channel. A timeout sends
 * SIGKILL to the command's process group (the guest has no exec cgroups the host can
 * kill), then drops the connection if the init does not answer. `overflowAtBytes`: stop
 * the command once stdout passes it (the files API's size cap).
 */
async function run(
  vm: VmCommandTarget,
  start: CommandStart,
  opts: { timeoutMs: number; onOutput?: RuntimeExecSpec['onOutput']; overflowAtBytes?: number; commandId?: string; stdinOpen?: boolean },
): Promise<Run> {
  const began = performance.now();
  const out: Run = { exitCode: -1, stdout: [], stderr: [], truncated: false, timedOut: false, overflowed: false, oomKills: 0, durationMs: 0 };
  let stdoutBytes = 0;
  const abandon = new AbortController();
  let channel: CommandChannel | undefined;
  const kill = (): void => {
    channel?.signal(9);
    setTimeout(() => abandon.abort(), KILL_GRACE_MS).unref();
  };
  let channelPromise: Promise<CommandChannel>;
  // A spawn's stdin is open as asked; an attached command's as the init says.
  let stdinOpen = opts.stdinOpen === true;
  let opened!: (channel: CommandChannel | undefined) => void;
  const entry: LiveVmCommand | undefined = opts.commandId ? { opened: new Promise((r) => (opened = r)), stdinOpen, released: false } : undefined;
  if (entry) vm.live.set(opts.commandId!, entry);
  const lost = (err: InitLostError): RollboxError | CommandReleasedError =>
    entry?.released ? new CommandReleasedError(opts.commandId!) : new RollboxError('result_unknown', `sandbox ${vm.sandboxId}: ${err.message}`);
  try {
    channelPromise = openCommand(vm.initSocket, start, {
      onAttached: (info) => {
        stdinOpen = info.stdinOpen;
        if (entry) entry.stdinOpen = info.stdinOpen;
      },
      onOutput: (stream, chunk) => {
        if (stream === 'stdout') {
          stdoutBytes += chunk.length;
          if (opts.overflowAtBytes !== undefined && stdoutBytes > opts.overflowAtBytes && !out.overflowed) {
            out.overflowed = true;
            kill();
          }
        }
        out[stream].push(chunk);
        opts.onOutput?.(stream, chunk);
      },
      onTruncated: () => (out.truncated = true),
    }, abandon.signal);
    channel = await channelPromise;
    opened?.(channel);
  } catch (err) {
    opened?.(undefined);
    if (entry && vm.live.get(opts.commandId!) === entry) vm.live.delete(opts.commandId!);
    if (err instanceof InitLostError) throw lost(err);
    throw err;
  }
  const timer = setTimeout(() => {
    out.timedOut = true;
    kill();
  }, Math.max(0, opts.timeoutMs));
  try {
    const outcome = await channel.outcome;
    if (outcome.kind === 'refused') throw new RollboxError('invalid_request', `the sandbox init refused the command: ${outcome.message}`);
    if (outcome.kind === 'unknown') throw new RollboxError('not_found', `no command ${opts.commandId ?? ''} in sandbox ${vm.sandboxId}`);
    out.exitCode = outcome.exitCode;
    out.oomKills = outcome.oomKills ?? 0;
  } catch (err) {
    if (!(err instanceof InitLostError)) throw err;
    // Dropped by us after a kill the init did not report in time: the command is gone.
    if (!abandon.signal.aborted) throw lost(err);
    out.exitCode = 137;
  } finally {
    clearTimeout(timer);
    if (entry && vm.live.get(opts.commandId!) === entry) vm.live.delete(opts.commandId!);
  }
  out.durationMs = Math.round(performance.now() - began);
  return Object.assign(out, { channel });
}

function outcomeOf(r: Run): RuntimeExecOutcome {
  return {
    exitCode: r.exitCode,
    stdout: Buffer.concat(r.stdout).toString('utf8'),
    stderr: Buffer.concat(r.stderr).toString('utf8'),
    truncated: r.truncated,
    timedOut: r.timedOut,
    oomKilled: r.oomKills > 0,
    oomKills: r.oomKills,
    durationMs: r.durationMs,
  };
}

/** A durable command's result is recorded before the init may drop it (FORGET). */
async function settle(r: Run & { channel?: CommandChannel }, record?: (o: RuntimeExecOutcome) => Promise<void>): Promise<RuntimeExecOutcome> {
  const outcome = outcomeOf(r);
  try {
    await record?.(outcome);
  } finally {
    r.channel?.forget();
  }
  return outcome;
}

export async function execInVm(vm: VmCommandTarget, spec: RuntimeExecSpec): Promise<RuntimeExecOutcome> {
  const user = spec.user ?? vm.user;
  const start: CommandStart = {
    spawn: {
      argv: spec.argv,
      env: { ...vm.env, ...spec.env },
      cwd: spec.cwd ?? vm.workdir,
      ...(user ? { user } : {}),
      // Its own exec cgroup in the guest, picked by the guest's init, which counts its OOM kills.
      slot: AUTO_SLOT,
      stdoutCapBytes: spec.outputCapBytes,
      stderrCapBytes: spec.outputCapBytes,
      oomScoreAdj: 0,
      ...(spec.stdin !== undefined ? { stdin: Buffer.from(spec.stdin) } : {}),
      ...(spec.keepStdinOpen ? { keepStdinOpen: true } : {}),
      ...(spec.durable ? { durable: spec.durable } : {}),
    },
  };
  const r = await run(vm, start, { timeoutMs: spec.timeoutMs, onOutput: spec.onOutput, commandId: spec.durable?.commandId, stdinOpen: spec.keepStdinOpen });
  return spec.durable ? settle(r, spec.record) : outcomeOf(r);
}

export async function attachInVm(vm: VmCommandTarget, spec: RuntimeAttachSpec): Promise<RuntimeExecOutcome | undefined> {
  try {
    const r = await run(vm, { attach: { commandId: spec.commandId } }, { timeoutMs: spec.timeoutMs, onOutput: spec.onOutput, commandId: spec.commandId });
    return settle(r, spec.record);
  } catch (err) {
    if (err instanceof RollboxError && err.code === 'not_found') return undefined;
    throw err;
  }
}

export async function execRawInVm(vm: VmCommandTarget, spec: RuntimeRawExecSpec): Promise<RuntimeRawExecOutcome> {
  const start: CommandStart = {
    spawn: { argv: spec.argv, env: vm.env, cwd: '/', slot: '', stdoutCapBytes: spec.maxStdoutBytes + 1, stderrCapBytes: 64 * 1024, oomScoreAdj: 0, stdin: spec.stdin ?? Buffer.alloc(0) },
  };
  const r = await run(vm, start, { timeoutMs: spec.timeoutMs, overflowAtBytes: spec.maxStdoutBytes });
  return { exitCode: r.exitCode, stdout: Buffer.concat(r.stdout), stderr: Buffer.concat(r.stderr).toString('utf8').slice(0, 64 * 1024), overflowed: r.overflowed, timedOut: r.timedOut };
}
