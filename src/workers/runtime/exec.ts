import { performance } from 'node:perf_hooks';
import { RollboxError } from '../../api/index.ts';
import { InitLostError, runCommand, type CommandOutcome } from '../init/index.ts';
import { killCgroup, readOomKills } from './cgroups.ts';
import type { RuntimeContext, SandboxRecord } from './context.ts';
import { checkSandboxId, validateExec } from './layout.ts';
import type { RuntimeExecOutcome, RuntimeExecSpec, RuntimeRawExecOutcome, RuntimeRawExecSpec } from './types.ts';

interface CommandSpec {
  argv: string[];
  env: Record<string, string>;
  cwd?: string;
  /** Who the command runs as (the init resolves it); none: root. */
  user?: string;
  stdin?: Buffer;
  timeoutMs: number;
  stdoutCapBytes: number;
  stderrCapBytes: number;
  /** Stop the command once stdout passes its cap (the files API's size limit). */
  stopAtStdoutCap?: boolean;
  onOutput?: (stream: 'stdout' | 'stderr', chunk: Buffer) => void;
  kill?: AbortSignal;
}

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

function recordOf(ctx: RuntimeContext, sandboxId: string): SandboxRecord {
  checkSandboxId(sandboxId);
  const rec = ctx.sandboxes.get(sandboxId);
  if (!rec) throw new RollboxError('not_found', `sandbox ${sandboxId} is not on this host`);
  return rec;
}

/**
 * One command, forked by the sandbox's init into one of its exec cgroups. The init caps
 * each stream (the rest is drained and dropped there), so neither its memory nor this
 * process's grows with output. A timeout kills the exec cgroup, again every 20 ms until
 * the init reports the exit (a command that had not joined it yet is caught on a later
 * round); an init that does not report within execKillGraceMs is dropped, which makes it
 * kill the command's process group.
 */
async function runInSandbox(ctx: RuntimeContext, rec: SandboxRecord, spec: CommandSpec): Promise<CommandRun> {
  const slot = rec.slots.acquire();
  const oomBefore = readOomKills(slot.memory);
  const chunks = { stdout: [] as Buffer[], stderr: [] as Buffer[] };
  let truncated = false;
  let timedOut = false;
  let overflowed = false;
  let finished = false;
  let killer: NodeJS.Timeout | undefined;
  /** The kill round in progress: awaited before the slot can serve another command. */
  let killing: Promise<unknown> = Promise.resolve();
  const abandon = new AbortController();
  const stop = (): void => {
    if (killer || finished) return;
    const killedAt = Date.now();
    const round = (): void => {
      killing = killCgroup(slot.pids, slot.freezer, 100).finally(() => {
        if (finished) return;
        if (Date.now() - killedAt > ctx.execKillGraceMs) return abandon.abort();
        killer = setTimeout(round, 20);
      });
    };
    killer = setTimeout(round, 0);
  };
  const timer = setTimeout(() => {
    timedOut = true;
    stop();
  }, spec.timeoutMs);
  spec.kill?.addEventListener('abort', stop, { once: true });
  if (spec.kill?.aborted) stop();
  const started = performance.now();
  let outcome: CommandOutcome;
  try {
    outcome = await runCommand(
      rec.socketPath,
      {
        argv: spec.argv,
        env: rec.env ? { ...rec.env, ...spec.env } : spec.env,
        cwd: spec.cwd ?? rec.workdir,
        user: spec.user,
        slot: slot.name,
        stdin: spec.stdin,
        stdoutCapBytes: spec.stdoutCapBytes,
        stderrCapBytes: spec.stderrCapBytes,
        oomScoreAdj: ctx.sandboxOomScoreAdj,
      },
      {
        onOutput: (stream, chunk) => {
          chunks[stream].push(chunk);
          spec.onOutput?.(stream, chunk);
        },
        onTruncated: (stream) => {
          truncated = true;
          if (stream === 'stdout' && spec.stopAtStdoutCap) {
            overflowed = true;
            stop();
          }
        },
      },
      abandon.signal,
    ).catch((err: unknown) => {
      // Stopped and dropped after the grace: the command was SIGKILLed with its group.
      if (abandon.signal.aborted) return { kind: 'exit', exitCode: 137, waitStatus: 9 } as const;
      throw err;
    });
  } finally {
    finished = true;
    clearTimeout(timer);
    spec.kill?.removeEventListener('abort', stop);
    clearTimeout(killer);
    await killing.catch(() => undefined);
  }
  const durationMs = Math.round((performance.now() - started) * 1000) / 1000;
  // Read before the slot can serve another command.
  const oomKills = Math.max(0, readOomKills(slot.memory) - oomBefore);
  // A refused start may have left a half-started command behind (its keeper died mid-way).
  await rec.slots.release(slot, { kill: timedOut || overflowed || Boolean(spec.kill?.aborted) || abandon.signal.aborted || outcome.kind === 'refused' });
  if (outcome.kind === 'refused') {
    return { exitCode: 255, stdout: Buffer.alloc(0), stderr: Buffer.from(`rollbox: cannot start command: ${outcome.message}\n`), truncated, timedOut, overflowed, oomKills, durationMs };
  }
  return { exitCode: outcome.exitCode, stdout: Buffer.concat(chunks.stdout), stderr: Buffer.concat(chunks.stderr), truncated, timedOut, overflowed, oomKills, durationMs };
}

export async function execCommand(ctx: RuntimeContext, sandboxId: string, spec: RuntimeExecSpec): Promise<RuntimeExecOutcome> {
  const rec = recordOf(ctx, sandboxId);
  validateExec(spec);
  // The init takes the user as one NUL-terminated string.
  if (spec.user !== undefined && (spec.user === '' || spec.user.includes('\0'))) throw new RollboxError('invalid_request', 'user must be a name, uid, name:group or uid:gid');
  const release = spec.holdBackBesteffort && !rec.besteffort ? ctx.guard.hold() : undefined;
  try {
    const run = await runInSandbox(ctx, rec, {
      argv: spec.argv,
      env: spec.env,
      cwd: spec.cwd,
      // The files API's raw commands (execRawCommand) name nobody and stay root.
      user: spec.user ?? rec.user,
      stdin: spec.stdin === undefined ? undefined : Buffer.from(spec.stdin, 'utf8'),
      timeoutMs: spec.timeoutMs,
      stdoutCapBytes: spec.outputCapBytes,
      stderrCapBytes: spec.outputCapBytes,
      onOutput: spec.onOutput,
      kill: spec.kill,
    });
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
  } finally {
    release?.();
  }
}

/** The files API's commands: bytes in and out, run as root from / with no extra environment. */
export async function execRawCommand(ctx: RuntimeContext, sandboxId: string, spec: RuntimeRawExecSpec): Promise<RuntimeRawExecOutcome> {
  const rec = recordOf(ctx, sandboxId);
  const run = await runInSandbox(ctx, rec, {
    argv: spec.argv,
    env: {},
    cwd: '/', // the sandbox's workdir may be gone
    stdin: spec.stdin,
    timeoutMs: spec.timeoutMs,
    // Kept up to the cap; one byte more marks it truncated and stops the command.
    stdoutCapBytes: spec.maxStdoutBytes,
    stderrCapBytes: 64 * 1024,
    stopAtStdoutCap: true,
  });
  return { exitCode: run.exitCode, stdout: run.stdout, stderr: run.stderr.toString('utf8'), overflowed: run.overflowed, timedOut: run.timedOut };
}

export { InitLostError };
