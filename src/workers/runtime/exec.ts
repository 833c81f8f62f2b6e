import { performance } from 'node:perf_hooks';
import { RollboxError } from '../../api/index.ts';
import { InitLostError, openCommand, type CommandChannel, type CommandOutcome, type PtySize } from '../init/index.ts';
import { killCgroup, readOomKills } from './cgroups.ts';
import type { RuntimeContext, SandboxRecord } from './context.ts';
import { validateExec } from './layout.ts';
import { liveOf, recordOf, type LiveCommand } from './live-commands.ts';
import type { ExecSlot } from './exec-slots.ts';
import type { RuntimeAttachSpec, RuntimeExecOutcome, RuntimeExecSpec, RuntimeRawExecOutcome, RuntimeRawExecSpec } from './types.ts';

interface CommandSpec {
  argv: string[];
  env: Record<string, string>;
  cwd?: string;
  /** Who the command runs as (the init resolves it); none: root. */
  user?: string;
  stdin?: Buffer;
  keepStdinOpen?: boolean;
  timeoutMs: number;
  stdoutCapBytes: number;
  stderrCapBytes: number;
  /** Stop the command once stdout passes its cap (the files API's size limit). */
  stopAtStdoutCap?: boolean;
  onOutput?: (stream: 'stdout' | 'stderr', chunk: Buffer) => void;
  durable?: { commandId: string; graceMs: number };
  /** On a terminal of this size: one output stream (stdout), of which only the tail is kept in the result. */
  pty?: PtySize;
}

/**
 * A terminal session's output is streamed as it comes; the result keeps only its last
 * bytes (the screen's worth and more), not a session's whole history in memory.
 */
export const PTY_RESULT_TAIL_BYTES = 64 * 1024;
/**
 * A terminal session's output cap (at least the exec cap): a session lives long and its
 * output, kept in the init until the session ends (a worker restart replays it), counts
 * against the sandbox's disk past 64 KiB. Past it the terminal's output is dropped.
 */
export const PTY_OUTPUT_CAP_BYTES = 16 * 1024 * 1024;

interface CommandRun {
  exitCode: number;
  stdout: Buffer;
  stderr: Buffer;
  truncated: boolean;
  timedOut: boolean;
  overflowed: boolean;
  oomKills: number;
  durationMs: number;
}

/**
 * This worker process let go of a durable command (it stops, leaving its sandboxes to the
 * next start): no outcome here; the command runs on in its init for the next one.
 */
export class CommandReleasedError extends Error {
  constructor(commandId: string) {
    super(`command ${commandId} was left running for the next worker process`);
    this.name = 'CommandReleasedError';
  }
}

/** How a command is reached: spawned now, or attached to (a durable one a previous worker spawned). */
type Start = { spawn: CommandSpec } | { attach: { commandId: string; timeoutMs: number; onOutput?: CommandSpec['onOutput'] } };

/**
 * One command, forked by the sandbox's init into one of its exec cgroups (or, attached,
 * found in the one it runs in). The init caps each stream (the rest is drained and dropped
 * there), so neither its memory nor this process's grows with output. A timeout kills the
 * exec cgroup, again every 20 ms until the init reports the exit (a command that had not
 * joined it yet is caught on a later round); an init that does not report within
 * execKillGraceMs is dropped, which makes it kill the command's process group. `record`
 * runs before the init may forget a durable command. Undefined: an attach found nothing.
 */
async function runInSandbox(ctx: RuntimeContext, rec: SandboxRecord, start: Start, record?: (run: CommandRun) => Promise<void>): Promise<CommandRun | undefined> {
  const spec = 'spawn' in start ? start.spawn : undefined;
  const attach = 'attach' in start ? start.attach : undefined;
  const onOutput = spec ? spec.onOutput : attach?.onOutput;
  const commandId = spec ? spec.durable?.commandId : attach?.commandId;
  const chunks = { stdout: [] as Buffer[], stderr: [] as Buffer[] };
  /** A terminal's output: only its tail is kept (PTY_RESULT_TAIL_BYTES). */
  let ptyTail = spec?.pty !== undefined;
  let truncated = false;
  let timedOut = false;
  let overflowed = false;
  let finished = false;
  let killer: NodeJS.Timeout | undefined;
  /** The kill round in progress: awaited before the slot can serve another command. */
  let killing: Promise<unknown> = Promise.resolve();
  const abandon = new AbortController();
  let channel: CommandChannel | undefined;
  let slot: ExecSlot | undefined = spec ? rec.slots.acquire() : undefined;
  let attached: (() => void) | undefined;
  const slotKnown = new Promise<void>((resolve) => (attached = resolve));
  let oomBefore = slot ? readOomKills(slot.memory) : 0;
  const stop = (): void => {
    if (killer || finished) return;
    const killedAt = Date.now();
    const round = (): void => {
      killing = (slot ? killCgroup(slot.pids, slot.freezer, 100) : Promise.resolve()).finally(() => {
        if (finished) return;
        if (Date.now() - killedAt > ctx.execKillGraceMs) {
          // Dropping a durable command's connection would not kill it: the init is told first.
          channel?.signal(9);
          return abandon.abort();
        }
        killer = setTimeout(round, 20);
      });
    };
    killer = setTimeout(round, 0);
  };
  const timer = setTimeout(() => {
    timedOut = true;
    stop();
  }, spec ? spec.timeoutMs : Math.max(0, attach!.timeoutMs));
  const started = performance.now();
  let outcome: CommandOutcome;
  const live = liveOf(rec);
  let liveCommand: LiveCommand | undefined;
  let settleOpened: (opened: CommandChannel | undefined) => void = () => undefined;
  if (commandId !== undefined) {
    const opened = new Promise<CommandChannel | undefined>((resolve) => (settleOpened = resolve));
    // Attached, a command's stdin is as open as the init says (onAttached).
    liveCommand = {
      opened,
      stdinOpen: spec ? spec.keepStdinOpen === true || spec.pty !== undefined : false,
      pty: spec?.pty !== undefined,
      released: false,
      release() {
        this.released = true;
        void opened.then((taken) => taken?.close());
      },
    };
    live.set(commandId, liveCommand);
    ctx.commandChannels.add(liveCommand);
  }
  try {
    channel = await openCommand(
      rec.socketPath,
      spec
        ? {
            spawn: {
              argv: spec.argv,
              env: rec.env ? { ...rec.env, ...spec.env } : spec.env,
              cwd: spec.cwd ?? rec.workdir,
              user: spec.user,
              slot: slot!.name,
              stdin: spec.stdin,
              keepStdinOpen: spec.keepStdinOpen,
              stdoutCapBytes: spec.stdoutCapBytes,
              stderrCapBytes: spec.stderrCapBytes,
              oomScoreAdj: ctx.sandboxOomScoreAdj,
              durable: spec.durable,
              ...(spec.pty ? { pty: spec.pty } : {}),
            },
          }
        : { attach: { commandId: attach!.commandId } },
      {
        onAttached: (info) => {
          if (liveCommand) {
            liveCommand.stdinOpen = info.stdinOpen;
            liveCommand.pty = info.pty;
          }
          ptyTail = info.pty;
          if (info.slot) slot = rec.slots.claim(info.slot);
          // An attached command counts the OOM kills from here on (earlier ones are not told apart from its slot's past).
          if (slot) oomBefore = readOomKills(slot.memory);
          attached?.();
        },
        onOutput: (stream, chunk) => {
          chunks[stream].push(chunk);
          if (ptyTail) keepTail(chunks[stream]);
          onOutput?.(stream, chunk);
        },
        onTruncated: (stream) => {
          truncated = true;
          if (stream === 'stdout' && spec?.stopAtStdoutCap) {
            overflowed = true;
            stop();
          }
        },
      },
      abandon.signal,
    );
    settleOpened(channel);
    if (!spec) await Promise.race([slotKnown, channel.outcome.catch(() => undefined)]);
    outcome = await channel.outcome.catch((err: unknown) => {
      // Stopped and dropped after the grace: the command was SIGKILLed with its group.
      if (abandon.signal.aborted) return { kind: 'exit', exitCode: 137, waitStatus: 9 } as const;
      if (liveCommand?.released) throw new CommandReleasedError(commandId!);
      throw err;
    });
  } finally {
    finished = true;
    settleOpened(undefined);
    clearTimeout(timer);
    clearTimeout(killer);
    if (liveCommand) ctx.commandChannels.delete(liveCommand);
    if (commandId !== undefined && live.get(commandId) === liveCommand) live.delete(commandId);
    await killing.catch(() => undefined);
  }
  const durationMs = Math.round((performance.now() - started) * 1000) / 1000;
  // Read before the slot can serve another command.
  const oomKills = slot ? Math.max(0, readOomKills(slot.memory) - oomBefore) : 0;
  // A refused start may have left a half-started command behind (its keeper died mid-way).
  if (slot) await rec.slots.release(slot, { kill: timedOut || overflowed || abandon.signal.aborted || outcome.kind === 'refused' });
  if (outcome.kind === 'unknown') return undefined;
  const run: CommandRun =
    outcome.kind === 'refused'
      ? { exitCode: 255, stdout: Buffer.alloc(0), stderr: Buffer.from(`rollbox: cannot start command: ${outcome.message}\n`), truncated, timedOut, overflowed, oomKills, durationMs }
      : { exitCode: outcome.exitCode, stdout: Buffer.concat(chunks.stdout), stderr: Buffer.concat(chunks.stderr), truncated, timedOut, overflowed, oomKills, durationMs };
  try {
    await record?.(run);
    channel.forget();
  } finally {
    channel.close();
  }
  return run;
}

/** Drops the oldest chunks while the rest still hold PTY_RESULT_TAIL_BYTES. */
function keepTail(chunks: Buffer[]): void {
  let total = 0;
  for (const c of chunks) total += c.length;
  while (chunks.length > 1 && total - chunks[0]!.length >= PTY_RESULT_TAIL_BYTES) total -= chunks.shift()!.length;
}

function outcomeOf(run: CommandRun): RuntimeExecOutcome {
  return {
    exitCode: run.exitCode,
    stdout: run.stdout.toString('utf8'),
    stderr: run.stderr.toString('utf8'),
    truncated: run.truncated,
    timedOut: run.timedOut,
    oomKilled: run.oomKills > 0,
    oomKills: run.oomKills,
    durationMs: run.durationMs,
  };
}

export async function execCommand(ctx: RuntimeContext, sandboxId: string, spec: RuntimeExecSpec): Promise<RuntimeExecOutcome> {
  const rec = recordOf(ctx, sandboxId);
  validateExec(spec);
  // The init takes the user as one NUL-terminated string.
  if (spec.user !== undefined && (spec.user === '' || spec.user.includes('\0'))) throw new RollboxError('invalid_request', 'user must be a name, uid, name:group or uid:gid');
  const releaseGuard = spec.holdBackBesteffort && !rec.besteffort ? ctx.guard.hold() : undefined;
  try {
    const run = await runInSandbox(
      ctx,
      rec,
      {
        spawn: {
          argv: spec.argv,
          env: spec.env,
          cwd: spec.cwd,
          // The files API's raw commands (execRawCommand) name nobody and stay root.
          user: spec.user ?? rec.user,
          stdin: spec.stdin === undefined ? undefined : Buffer.from(spec.stdin, 'utf8'),
          keepStdinOpen: spec.keepStdinOpen,
          timeoutMs: spec.timeoutMs,
          stdoutCapBytes: spec.pty ? Math.max(spec.outputCapBytes, PTY_OUTPUT_CAP_BYTES) : spec.outputCapBytes,
          stderrCapBytes: spec.outputCapBytes,
          onOutput: spec.onOutput,
          durable: spec.durable,
          ...(spec.pty ? { pty: spec.pty, keepStdinOpen: true } : {}),
        },
      },
      // Besteffort neighbours go back to their quota before the caller hears of the result.
      spec.record &&
        ((r) => {
          releaseGuard?.();
          return spec.record!(outcomeOf(r));
        }),
    );
    return outcomeOf(run!);
  } finally {
    releaseGuard?.();
  }
}

/** The files API's commands: bytes in and out, run as root from / with no extra environment. */
export async function execRawCommand(ctx: RuntimeContext, sandboxId: string, spec: RuntimeRawExecSpec): Promise<RuntimeRawExecOutcome> {
  const rec = recordOf(ctx, sandboxId);
  const run = (await runInSandbox(ctx, rec, {
    spawn: {
      argv: spec.argv,
      env: {},
      cwd: '/', // the sandbox's workdir may be gone
      stdin: spec.stdin,
      timeoutMs: spec.timeoutMs,
      // Kept up to the cap; one byte more marks it truncated and stops the command.
      stdoutCapBytes: spec.maxStdoutBytes,
      stderrCapBytes: 64 * 1024,
      stopAtStdoutCap: true,
    },
  }))!;
  return { exitCode: run.exitCode, stdout: run.stdout, stderr: run.stderr.toString('utf8'), overflowed: run.overflowed, timedOut: run.timedOut };
}

/** A durable command a previous worker process started: collected from its start. */
export async function attachCommand(ctx: RuntimeContext, sandboxId: string, spec: RuntimeAttachSpec): Promise<RuntimeExecOutcome | undefined> {
  const rec = recordOf(ctx, sandboxId);
  const run = await runInSandbox(ctx, rec, { attach: spec }, spec.record && ((r) => spec.record!(outcomeOf(r))));
  return run && outcomeOf(run);
}

export { InitLostError };
