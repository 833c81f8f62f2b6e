import path from 'node:path';
import { z } from 'zod';
import { ExecUser } from './sandbox.ts';

/** A command's words, without a shell. */
const CommandArgv = z.array(z.string().max(131_072)).min(1).max(4096);
/** A command line for the image's `/bin/sh -c`. */
const CommandLine = z.string().min(1).max(262_144);
const CommandEnv = z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string().max(32_768)).default({});
/**
 * Not under /proc: a working directory there (/proc/self/fd/N) is how runc's fd leaks
 * reached the host (CVE-2024-21626). runc itself refuses it too; a symlink made inside
 * the sandbox gets past this check and meets that second wall.
 */
const CommandCwd = z
  .string()
  .startsWith('/')
  .max(4096)
  .refine((p) => !/^\/proc(\/|$)/.test(path.posix.normalize(p)), 'must not be under /proc');
const CommandTimeoutMs = z.number().int().min(1).max(24 * 3600 * 1000);
/** Idempotency id of a command within its sandbox. */
const CommandId = z.string().regex(/^[A-Za-z0-9_.:-]{1,128}$/);

export const ExecRequest = z
  .strictObject({
    /** Run without a shell. */
    argv: CommandArgv.optional(),
    /** Run with the image's `/bin/sh -c`. */
    cmd: CommandLine.optional(),
    stdin: z.string().max(8 * 1024 * 1024).optional(),
    env: CommandEnv,
    cwd: CommandCwd.optional(),
    /** Who the command runs as: `name`, `uid`, `name:group` or `uid:gid` (the sandbox's /etc/passwd and /etc/group). Default: the sandbox's user, else root. */
    user: ExecUser.optional(),
    /** Default 60 s; for `background` commands, 24 h. */
    timeoutMs: CommandTimeoutMs.optional(),
    /** Return at once with the command's id; read its status and output later (GET .../commands/:commandId). */
    background: z.boolean().default(false),
    /** Idempotency id of this command within the sandbox. */
    commandId: CommandId.optional(),
    /** Keep stdin open (after `stdin`, if given) for POST .../commands/:commandId/stdin; it ends with `eof`. */
    stdinOpen: z.boolean().optional(),
  })
  .refine((r) => (r.argv === undefined) !== (r.cmd === undefined), { message: 'give exactly one of argv or cmd', path: ['argv'] });
export type ExecRequest = z.infer<typeof ExecRequest>;

/** A terminal's size in character cells. */
export const PtySize = z.strictObject({
  cols: z.number().int().min(1).max(1000),
  rows: z.number().int().min(1).max(1000),
});
export type PtySize = z.infer<typeof PtySize>;

/**
 * POST /v1/sandboxes/:id/pty: a command on a terminal the sandbox's init allocates (its
 * controlling terminal, `TERM=xterm-256color` unless `env` says otherwise). A command like
 * the others (command log, signal, stdin, wait); its output is one stream, `stdout`.
 */
export const PtyRequest = z
  .strictObject({
    /** Default: the image's shell, interactive and login (bash if the image has it, else /bin/sh). */
    argv: CommandArgv.optional(),
    /** Run with the image's `/bin/sh -c` on the terminal. */
    cmd: CommandLine.optional(),
    cols: PtySize.shape.cols.default(80),
    rows: PtySize.shape.rows.default(24),
    env: CommandEnv,
    cwd: CommandCwd.optional(),
    user: ExecUser.optional(),
    /** Default 24 h, as a background command's. */
    timeoutMs: CommandTimeoutMs.optional(),
    commandId: CommandId.optional(),
  })
  .refine((r) => r.argv === undefined || r.cmd === undefined, { message: 'give at most one of argv or cmd', path: ['argv'] });
export type PtyRequest = z.infer<typeof PtyRequest>;

/** POST /v1/sandboxes/:id/commands/:commandId/resize: a pty command's new size (its foreground process group gets SIGWINCH). */
export const CommandResizeRequest = PtySize;
export type CommandResizeRequest = PtySize;

export const ExecResult = z.object({
  commandId: z.string(),
  exitCode: z.number().int(),
  stdout: z.string(),
  stderr: z.string(),
  /** True when stdout or stderr was cut at the output cap. */
  truncated: z.boolean(),
  timedOut: z.boolean(),
  /** The command (or one of its children) was killed by the sandbox's memory limit. */
  oomKilled: z.boolean(),
  durationMs: z.number(),
  /** True when this result was recorded earlier and is returned without running again. */
  replayed: z.boolean(),
});
export type ExecResult = z.infer<typeof ExecResult>;

export const CommandState = z.enum(['queued', 'running', 'done', 'unknown']);
export type CommandState = z.infer<typeof CommandState>;

/**
 * One entry of a sandbox's command log (its trajectory). `unknown`: the worker host died
 * or restarted while the command ran, so whether it had side effects cannot be known;
 * it is never run again under the same commandId.
 */
export const CommandRecord = z.object({
  commandId: z.string(),
  argv: z.array(z.string()),
  state: CommandState,
  node: z.string(),
  queuedAt: z.string(),
  startedAt: z.string().optional(),
  endedAt: z.string().optional(),
  result: ExecResult.omit({ replayed: true }).optional(),
  /** A pty command: the size it started with. Its result's stdout is the tail of its output. */
  pty: PtySize.optional(),
});
export type CommandRecord = z.infer<typeof CommandRecord>;

export const ListCommandsQuery = z.strictObject({
  limit: z.coerce.number().int().min(1).max(1000).default(100),
  after: z.string().max(1024).optional().describe('A `nextCursor` of an earlier page: the commands after it (default: from the first).'),
});
export const CommandList = z.object({
  commands: z.array(CommandRecord),
  nextCursor: z.string().optional().describe('Present when more commands follow this page: ask again with `after` set to it.'),
  cursor: z.string().optional().describe('Where this page ends (after its last command; `after` itself for an empty page): commands sent later come after it, for a reader following a running sandbox.'),
});
export type CommandList = z.infer<typeof CommandList>;

/** A command's record plus the output it has produced so far (streamed from a background or streaming exec). */
export const CommandStatus = CommandRecord.extend({
  stdout: z.string(),
  stderr: z.string(),
});
export type CommandStatus = z.infer<typeof CommandStatus>;

export const DEFAULT_EXEC_TIMEOUT_MS = 60_000;
export const DEFAULT_BACKGROUND_TIMEOUT_MS = 24 * 3600 * 1000;

/** Signals a running command can be sent, by name (Linux numbers). */
export const SIGNAL_NUMBERS = { HUP: 1, INT: 2, QUIT: 3, KILL: 9, USR1: 10, USR2: 12, TERM: 15, CONT: 18, STOP: 19, TSTP: 20, WINCH: 28 } as const;
export const SignalName = z.enum(Object.keys(SIGNAL_NUMBERS) as [keyof typeof SIGNAL_NUMBERS, ...(keyof typeof SIGNAL_NUMBERS)[]]);
export type SignalName = z.infer<typeof SignalName>;

/** POST /v1/sandboxes/:id/commands/:commandId/signal: to the command's process group. */
export const CommandSignalRequest = z.strictObject({ signal: SignalName });
export type CommandSignalRequest = z.infer<typeof CommandSignalRequest>;

/** POST /v1/sandboxes/:id/commands/:commandId/stdin: bytes (UTF-8) for a command started with `stdinOpen`; `eof` closes its stdin. */
export const CommandStdinRequest = z.strictObject({
  data: z.string().max(1024 * 1024).default(''),
  eof: z.boolean().default(false),
});
export type CommandStdinRequest = z.infer<typeof CommandStdinRequest>;

/** What a signal or stdin request answers: it reached the running command. */
export const CommandInputResult = z.object({ commandId: z.string(), state: z.literal('running') });
export type CommandInputResult = z.infer<typeof CommandInputResult>;
