import net from 'node:net';
import { Frame, FrameDecoder, STDIN_CHUNK_BYTES, encodeAttach, encodeResize, encodeSignal, encodeSpawn, frame, type PtySize, type SpawnRequest } from './protocol.ts';

/**
 * The init of a sandbox is gone, or answered something no init would: nothing it said on
 * this connection counts as a result.
 */
export class InitLostError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'InitLostError';
  }
}

export interface CommandHandlers {
  /** The command was forked (pid inside the sandbox). */
  onStarted?: (pid: number) => void;
  /** An ATTACH took the command over: its pid (0: not started yet), whether it had ended, its exec cgroup. */
  /** `stdinOpen`: the command still takes stdin (an init older than this flag says false). */
  /** `pty`: it runs on a terminal (RESIZE applies). */
  onAttached?: (info: { pid: number; exited: boolean; stdinOpen: boolean; pty: boolean; slot: string }) => void;
  onOutput?: (stream: 'stdout' | 'stderr', chunk: Buffer) => void;
  /** The stream passed its cap: later bytes are dropped by the init (reported once per stream). */
  onTruncated?: (stream: 'stdout' | 'stderr') => void;
}

export type CommandOutcome =
  /**
   * exitCode: the exit status, or 128 + signal, from the init's own waitpid. oomKills: the
   * OOM kills its exec cgroup counted while it ran, as the init read them (0 without one;
   * absent from an init older than the count).
   */
  | { kind: 'exit'; exitCode: number; waitStatus: number; oomKills?: number }
  /** The init could not start the command (fork or pipe failed, a malformed request). */
  | { kind: 'refused'; message: string }
  /** ATTACH: the init holds no durable command of that id (never spawned, collected, or its grace ran out). */
  | { kind: 'unknown' };

/** How a connection starts: a new command, or a durable one a previous connection spawned. */
export type CommandStart = { spawn: Omit<SpawnRequest, 'hasStdin'> & { stdin?: Buffer; keepStdinOpen?: boolean } } | { attach: { commandId: string; fromOffset?: number } };

/** One connection to the init, holding one command. */
export interface CommandChannel {
  /** Settles once the command exited and its output was drained (or the init refused it). */
  outcome: Promise<CommandOutcome>;
  /** Bytes of logged output frames received so far: where an ATTACH would go on from. */
  readonly offset: number;
  /** Stdin, in chunks, respecting the init's backpressure (a spawn with stdin open). */
  writeStdin(data: Buffer): Promise<void>;
  closeStdin(): void;
  /** A signal to the command's process group. */
  signal(signo: number): void;
  /** A pty command's new window size (its foreground process group gets SIGWINCH). */
  resize(size: PtySize): void;
  /** A durable command's result is recorded: the init drops it. Closes the connection. */
  forget(): void;
  /** Closes the connection: a durable command runs on for its grace, any other is killed. */
  close(): void;
}

function connect(socketPath: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket = net.createConnection(socketPath);
    socket.once('connect', () => {
      socket.off('error', reject);
      resolve(socket);
    });
    socket.once('error', (err) => reject(new InitLostError(`cannot reach the sandbox init: ${err.message}`)));
  });
}

/**
 * Opens a connection to the init listening at `socketPath` for one command. Its outcome
 * rejects with InitLostError when the connection ends without one. `signal` drops the
 * connection (a non-durable command's process group is then killed by the init).
 */
export async function openCommand(socketPath: string, start: CommandStart, handlers: CommandHandlers = {}, signal?: AbortSignal): Promise<CommandChannel> {
  const socket = await connect(socketPath);
  const durable = 'attach' in start || start.spawn.durable !== undefined;
  let offset = 0;
  let settled = false;
  let stdinWrites: Promise<void> = Promise.resolve();
  let resolveOutcome!: (o: CommandOutcome) => void;
  let rejectOutcome!: (e: Error) => void;
  const outcome = new Promise<CommandOutcome>((resolve, reject) => {
    resolveOutcome = resolve;
    rejectOutcome = reject;
  });
  // Nobody may be listening yet (the caller awaits the channel first).
  outcome.catch(() => {});
  const finish = (fn: () => void, keepOpen = false): void => {
    if (settled) return;
    settled = true;
    signal?.removeEventListener('abort', onAbort);
    if (!keepOpen) socket.destroy();
    fn();
  };
  const onAbort = (): void => finish(() => rejectOutcome(new InitLostError('command abandoned')));
  signal?.addEventListener('abort', onAbort, { once: true });
  const decoder = new FrameDecoder();
  socket.on('data', (chunk: Buffer) => {
    try {
      decoder.push(chunk, (type, payload) => {
        switch (type) {
          case Frame.started:
            handlers.onStarted?.(payload.readUInt32LE(0));
            break;
          case Frame.attached:
            handlers.onAttached?.({ pid: payload.readUInt32LE(0), exited: (payload.readUInt32LE(4) & 1) !== 0, stdinOpen: (payload.readUInt32LE(4) & 2) !== 0, pty: (payload.readUInt32LE(4) & 4) !== 0, slot: payload.subarray(8).toString('utf8') });
            break;
          case Frame.stdout:
          case Frame.stderr:
            offset += 8 + payload.length;
            handlers.onOutput?.(type === Frame.stdout ? 'stdout' : 'stderr', payload);
            break;
          case Frame.truncated:
            offset += 9;
            handlers.onTruncated?.(payload[0] === 0 ? 'stdout' : 'stderr');
            break;
          case Frame.exit:
            // A durable command stays in the init until forget(): the connection stays open for it.
            finish(() => resolveOutcome({ kind: 'exit', exitCode: payload.readInt32LE(0), waitStatus: payload.readInt32LE(4), ...(payload.length >= 12 ? { oomKills: payload.readUInt32LE(8) } : {}) }), durable);
            break;
          case Frame.error:
            // An attach is refused only when the command's status is lost (or by a bug of ours): no result.
            if ('attach' in start) finish(() => rejectOutcome(new InitLostError(payload.toString('utf8'))));
            else finish(() => resolveOutcome({ kind: 'refused', message: payload.toString('utf8') }));
            break;
          case Frame.unknown:
            finish(() => resolveOutcome({ kind: 'unknown' }));
            break;
          default:
            throw new Error(`unexpected frame type ${type}`);
        }
      });
    } catch (err) {
      finish(() => rejectOutcome(new InitLostError(`bad frame from the sandbox init: ${(err as Error).message}`)));
    }
  });
  socket.on('error', (err) => finish(() => rejectOutcome(new InitLostError(`connection to the sandbox init failed: ${err.message}`))));
  socket.on('close', () => finish(() => rejectOutcome(new InitLostError('the sandbox init closed the connection before the command ended'))));
  if (signal?.aborted) onAbort();
  const channel: CommandChannel = {
    outcome,
    get offset() {
      return offset;
    },
    writeStdin(data) {
      stdinWrites = stdinWrites.then(() => writeChunks(socket, data));
      return stdinWrites;
    },
    closeStdin() {
      stdinWrites = stdinWrites.then(() => {
        if (!socket.destroyed) socket.write(frame(Frame.stdinEof));
      });
    },
    signal(signo) {
      if (!socket.destroyed) socket.write(encodeSignal(signo));
    },
    resize(size) {
      if (!socket.destroyed) socket.write(encodeResize(size));
    },
    forget() {
      if (!socket.destroyed) socket.end(frame(Frame.forget));
    },
    close() {
      socket.destroy();
    },
  };
  if ('attach' in start) {
    socket.write(encodeAttach(start.attach.commandId, start.attach.fromOffset));
  } else {
    const { stdin, keepStdinOpen, ...spawn } = start.spawn;
    socket.write(encodeSpawn({ ...spawn, hasStdin: stdin !== undefined || keepStdinOpen === true || spawn.pty !== undefined }));
    if (stdin !== undefined) void channel.writeStdin(stdin);
    if (stdin !== undefined && !keepStdinOpen) channel.closeStdin();
  }
  return channel;
}

/**
 * Runs one command through the init listening at `socketPath` and resolves with its
 * outcome once it exited and its output was drained. Rejects with InitLostError when the
 * init cannot be reached or the connection ends without an outcome. `signal` drops the
 * connection, which makes the init kill the command's process group.
 */
export async function runCommand(
  socketPath: string,
  request: Omit<SpawnRequest, 'hasStdin' | 'durable'> & { stdin?: Buffer },
  handlers: CommandHandlers = {},
  signal?: AbortSignal,
): Promise<CommandOutcome> {
  return (await openCommand(socketPath, { spawn: request }, handlers, signal)).outcome;
}

/** Stdin in chunks, respecting the socket's backpressure (the init stops reading while the command does not). */
async function writeChunks(socket: net.Socket, data: Buffer): Promise<void> {
  for (let off = 0; off < data.length && !socket.destroyed; off += STDIN_CHUNK_BYTES) {
    if (!socket.write(frame(Frame.stdin, data.subarray(off, off + STDIN_CHUNK_BYTES)))) {
      await new Promise<void>((resolve) => {
        const go = (): void => {
          socket.off('drain', go);
          socket.off('close', go);
          resolve();
        };
        socket.on('drain', go);
        socket.on('close', go);
      });
    }
  }
}

/**
 * RELEASE: the init lets go of every durable command it holds (a microVM fork's child,
 * whose init holds its parent's commands): each runs on detached, its output dropped, no
 * longer attachable. Resolves with how many it released.
 */
export async function releaseCommands(socketPath: string): Promise<number> {
  const socket = await connect(socketPath);
  return new Promise<number>((resolve, reject) => {
    const decoder = new FrameDecoder();
    const fail = (why: string): void => {
      socket.destroy();
      reject(new InitLostError(`release of the sandbox's commands: ${why}`));
    };
    socket.on('data', (chunk: Buffer) => {
      try {
        decoder.push(chunk, (type, payload) => {
          if (type !== Frame.released) throw new Error(type === Frame.error ? payload.toString('utf8') : `unexpected frame type ${type}`);
          socket.destroy();
          resolve(payload.readUInt32LE(0));
        });
      } catch (err) {
        fail((err as Error).message);
      }
    });
    socket.on('error', (err) => fail(err.message));
    socket.on('close', () => fail('the init closed the connection'));
    socket.write(frame(Frame.release));
  });
}
