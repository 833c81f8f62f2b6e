import { setTimeout as sleep } from 'node:timers/promises';
import { randomInt } from 'node:crypto';
import type { Context } from 'hono';
import type { Redis } from 'ioredis';
import { E2bCloseStdinRequest, E2bConnectRequest, E2bListRequest, E2bSendInputRequest, E2bSendSignalRequest, E2bStartRequest, E2bStreamInputRequest, E2bUpdateRequest, ExecRequest, RollboxError, type CommandRecord } from '../../api/index.ts';
import { describeZodError } from '../errors.ts';
import type { ExecEvent, ExecService } from '../exec-service.ts';
import { PTY_DEFAULT_SHELL } from '../pty.ts';
import { ConnectError, readClientStream, readStreamRequest, readUnary, streamResponse } from './connect.ts';
import { keepaliveMsOf, resolvePath, timeoutMsOf, type EnvdCall } from './envd-common.ts';

export interface E2bProcessDeps {
  redis: Redis;
  execs: Pick<ExecService, 'startStreaming' | 'followCommand' | 'commandLog' | 'commandStatus' | 'signalCommand' | 'writeCommandStdin' | 'resizeCommand'>;
}

/**
 * E2B's `/bin/bash -l -c <cmd>`, in images with bash; in images without it (busybox), the
 * same command run by this `/bin/sh` itself (eval: no second exec). `$0` is the command:
 * nothing of it is parsed here.
 */
const BASH_OR_SH = '[ -x /bin/bash ] && exec /bin/bash -l -c "$0"; eval "$0"';
/** An E2B command's commandId in the command log: its pid makes it. */
const COMMAND_PREFIX = 'e2b.';
/** A sandbox's process tags outlive it by a little; its longest TTL is 7 days. */
const TAG_KEYS_TTL_SEC = 8 * 24 * 3600;
/** Pids are uint32 in envd's proto; kept below 2^31 for clients that read them signed. */
const MAX_PID = 2 ** 31 - 1;

const tagsKey = (sandboxId: string) => `rb:e2b:{${sandboxId}}:tags`;
const commandIdOf = (pid: number) => `${COMMAND_PREFIX}${pid}`;

/** The argv rollbox runs for an E2B process config. */
function argvOf(process: E2bStartRequest['process']): string[] {
  const { cmd, args } = process;
  if (cmd === '/bin/bash' && args.length === 3 && args[0] === '-l' && args[1] === '-c') return ['/bin/sh', '-c', BASH_OR_SH, args[2]!];
  // The SDK's terminal (pty.create): bash, or the image's /bin/sh where there is none.
  if (cmd === '/bin/bash' && args.length === 2 && args[0] === '-i' && args[1] === '-l') return ['/bin/sh', '-c', PTY_DEFAULT_SHELL];
  return [cmd, ...args];
}

/** The E2B process config a recorded command was started from (the inverse of argvOf). */
function configOf(record: CommandRecord): { cmd: string; args: string[]; envs: Record<string, never> } {
  const [cmd = '', ...args] = record.argv;
  if (cmd === '/bin/sh' && args[1] === BASH_OR_SH) return { cmd: '/bin/bash', args: ['-l', '-c', args[2] ?? ''], envs: {} };
  if (cmd === '/bin/sh' && args.length === 2 && args[1] === PTY_DEFAULT_SHELL) return { cmd: '/bin/bash', args: ['-i', '-l'], envs: {} };
  return { cmd, args, envs: {} };
}

/** A ProcessEvent for each rollbox output event: data as base64 bytes (a terminal's as `pty`), the exit as `end`. */
function eventOf(ev: ExecEvent, pty: boolean): unknown {
  if (ev.event === 'stdout' || ev.event === 'stderr') return { event: { data: { [pty ? 'pty' : ev.event]: Buffer.from(ev.data).toString('base64') } } };
  const outcome = JSON.parse(ev.data) as { exitCode: number; timedOut?: boolean };
  // As envd (Go's ProcessState): a command killed at its deadline has exit code -1.
  if (outcome.timedOut) return { event: { end: { exitCode: -1, exited: false, status: 'signal: killed', error: 'signal: killed' } } };
  return { event: { end: { exitCode: outcome.exitCode, exited: true, status: `exit status ${outcome.exitCode}` } } };
}

/** SIGKILL's exit status (128 + 9), outside a timeout rollbox applied itself. */
function killedOutright(ev: ExecEvent): boolean {
  if (ev.event === 'stdout' || ev.event === 'stderr') return false;
  const outcome = JSON.parse(ev.data) as { exitCode: number | null; timedOut?: boolean };
  return !outcome.timedOut && (outcome.exitCode === 137 || outcome.exitCode === null);
}
const KILLED_SANDBOX_LOOKS = 5;
const KILLED_SANDBOX_LOOK_MS = 200;

/** ProcessInput's bytes (stdin or pty, base64) as the UTF-8 text rollbox's stdin carries. */
function inputText(input: { stdin?: string | undefined; pty?: string | undefined }): string {
  return Buffer.from(input.stdin ?? input.pty ?? '', 'base64').toString('utf8');
}

/**
 * envd's process service over rollbox's exec: every E2B command is a command of the
 * command log (commandId `e2b.<pid>`, the pid drawn at random), run once,
 * its output streamed through the log's output stream, its exit status the init's.
 * A command outlives the stream that started it; Connect re-attaches by pid or tag and
 * replays its output from the start.
 */
export function processService(deps: E2bProcessDeps) {
  const { redis, execs } = deps;

  async function* started(call: EnvdCall, pid: number, events: AsyncGenerator<ExecEvent>, pty = false): AsyncGenerator<unknown> {
    yield { event: { start: { pid } } };
    try {
      for await (const ev of events) {
        if (killedOutright(ev)) await throwIfSandboxGone(call);
        yield eventOf(ev, pty);
      }
    } catch (err) {
      throw await call.explain(err);
    }
  }

  /**
   * A command SIGKILLed with its sandbox (killed, or at its timeout) ends as on E2B: its
   * stream drops (`unavailable`), not an exit. Its exit can reach the stream just before the
   * sandbox's record says it is going: looked at a few times, a bounded while.
   */
  async function throwIfSandboxGone(call: EnvdCall): Promise<void> {
    for (let look = 0; look < KILLED_SANDBOX_LOOKS; look++) {
      if (look > 0) await sleep(KILLED_SANDBOX_LOOK_MS);
      const explained = await call.explain(new RollboxError('result_unknown', 'the command was killed'));
      if (explained instanceof ConnectError) throw explained;
    }
  }

  async function pidOf(sandboxId: string, selector: { pid: number } | { tag: string }): Promise<number> {
    if ('pid' in selector) return selector.pid;
    const pid = Number(await redis.hget(tagsKey(sandboxId), selector.tag));
    if (!pid) throw new ConnectError('not_found', `process with tag ${selector.tag} not found`);
    return pid;
  }

  return {
    async Start(c: Context, call: EnvdCall): Promise<Response> {
      const request = await readStreamRequest(c, E2bStartRequest);
      const cwd = request.process.cwd ? resolvePath(request.process.cwd, call.user, await call.sandbox()) : undefined;
      const timeoutMs = timeoutMsOf(c);
      const pty = request.pty?.size;
      // A terminal always takes input (envd's pty.create sends no `stdin`).
      const checked = ExecRequest.safeParse({ argv: argvOf(request.process), env: request.process.envs, cwd, user: call.user, timeoutMs, stdinOpen: request.stdin === true || pty !== undefined });
      if (!checked.success) throw new ConnectError('invalid_argument', describeZodError(checked.error, 'process'));
      // A random pid is its commandId at no Redis call; a (rare) clash with an earlier command picks another.
      for (let attempt = 0; attempt < 5; attempt++) {
        const pid = randomInt(1, MAX_PID);
        const run = await call.guard(execs.startStreaming(call.principal, call.sandboxId, { ...checked.data, commandId: commandIdOf(pid) }, pty));
        if (!run.launched) {
          await run.events.return(undefined);
          continue;
        }
        if (request.tag) await redis.multi().hset(tagsKey(call.sandboxId), request.tag, pid).expire(tagsKey(call.sandboxId), TAG_KEYS_TTL_SEC).exec();
        return streamResponse(c, started(call, pid, run.events, pty !== undefined), { message: { event: { keepalive: {} } }, everyMs: keepaliveMsOf(c) });
      }
      throw new ConnectError('internal', 'no free pid after 5 tries');
    },

    async Connect(c: Context, call: EnvdCall): Promise<Response> {
      const { process } = await readStreamRequest(c, E2bConnectRequest);
      const pid = await pidOf(call.sandboxId, process);
      const status = await call.guard(execs.commandStatus(call.principal, call.sandboxId, commandIdOf(pid)));
      const events = execs.followCommand(call.principal, call.sandboxId, commandIdOf(pid), { timeoutMs: timeoutMsOf(c) });
      return streamResponse(c, started(call, pid, events, status.pty !== undefined), { message: { event: { keepalive: {} } }, everyMs: keepaliveMsOf(c) });
    },

    /** The signal to the command's process group (rollbox's signal by command id); one that is not running is `not_found`, as envd says. */
    async SendSignal(c: Context, call: EnvdCall): Promise<Response> {
      const { process, signal } = await readUnary(c, E2bSendSignalRequest);
      const pid = await pidOf(call.sandboxId, process);
      const name = signal === 'SIGNAL_SIGKILL' || signal === 9 ? 'KILL' : 'TERM';
      const sent = execs.signalCommand(call.principal, call.sandboxId, commandIdOf(pid), name).catch((err: unknown) => {
        throw err instanceof RollboxError && err.code === 'invalid_state' ? new RollboxError('not_found', err.message) : err;
      });
      await call.guard(sent);
      return c.json({}, 200);
    },

    /** Input for a command started with `stdin: true`, or a pty's (keys typed): rollbox's stdin by command id (UTF-8). */
    async SendInput(c: Context, call: EnvdCall): Promise<Response> {
      const { process, input } = await readUnary(c, E2bSendInputRequest);
      const pid = await pidOf(call.sandboxId, process);
      await call.guard(execs.writeCommandStdin(call.principal, call.sandboxId, commandIdOf(pid), { data: inputText(input), eof: false }));
      return c.json({}, 200);
    },

    /** A pty's new size (rollbox's resize by command id); a command not on a terminal is `invalid_argument`, an ended one `not_found`. */
    async Update(c: Context, call: EnvdCall): Promise<Response> {
      const { process, pty } = await readUnary(c, E2bUpdateRequest);
      const pid = await pidOf(call.sandboxId, process);
      if (!pty) return c.json({}, 200);
      const status = await call.guard(execs.commandStatus(call.principal, call.sandboxId, commandIdOf(pid)));
      if (!status.pty) throw new ConnectError('invalid_argument', `process ${pid} is not a pty`);
      const resized = execs.resizeCommand(call.principal, call.sandboxId, commandIdOf(pid), pty.size).catch((err: unknown) => {
        throw err instanceof RollboxError && err.code === 'invalid_state' ? new RollboxError('not_found', err.message) : err;
      });
      await call.guard(resized);
      return c.json({}, 200);
    },

    /**
     * Stdin as a client stream: a start naming the process, then data as it comes (each
     * piece delivered on arrival); the stream's end leaves stdin open, as envd does.
     */
    async StreamInput(c: Context, call: EnvdCall): Promise<Response> {
      async function* consume(): AsyncGenerator<object> {
        let commandId: string | undefined;
        for await (const message of readClientStream(c, E2bStreamInputRequest)) {
          if (message.start) commandId = commandIdOf(await pidOf(call.sandboxId, message.start.process));
          else if (message.data) {
            if (!commandId) throw new ConnectError('invalid_argument', 'data before the start message naming the process');
            await call.guard(execs.writeCommandStdin(call.principal, call.sandboxId, commandId, { data: inputText(message.data.input), eof: false }));
          }
        }
        yield {};
      }
      // One answer message, at the end: no keepalives in between.
      return streamResponse(c, consume(), { message: {}, everyMs: 2 ** 31 - 1 });
    },

    /** EOF on the command's stdin. */
    async CloseStdin(c: Context, call: EnvdCall): Promise<Response> {
      const { process } = await readUnary(c, E2bCloseStdinRequest);
      const pid = await pidOf(call.sandboxId, process);
      await call.guard(execs.writeCommandStdin(call.principal, call.sandboxId, commandIdOf(pid), { data: '', eof: true }));
      return c.json({}, 200);
    },

    /** The E2B commands still queued or running. */
    async List(c: Context, call: EnvdCall): Promise<Response> {
      await readUnary(c, E2bListRequest);
      const [records, tags] = await Promise.all([call.guard(execs.commandLog(call.principal, call.sandboxId, 1000)), redis.hgetall(tagsKey(call.sandboxId))]);
      const tagOf = new Map(Object.entries(tags).map(([tag, pid]) => [Number(pid), tag]));
      const processes = records
        .filter((r) => r.commandId.startsWith(COMMAND_PREFIX) && (r.state === 'queued' || r.state === 'running'))
        .map((r) => {
          const pid = Number(r.commandId.slice(COMMAND_PREFIX.length));
          return { pid, config: configOf(r), ...(tagOf.has(pid) ? { tag: tagOf.get(pid) } : {}) };
        });
      return c.json({ processes }, 200);
    },
  };
}
