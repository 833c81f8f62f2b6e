import net from 'node:net';
import { Frame, FrameDecoder, STDIN_CHUNK_BYTES, encodeSpawn, frame, type SpawnRequest } from './protocol.ts';

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
  onOutput?: (stream: 'stdout' | 'stderr', chunk: Buffer) => void;
  /** The stream passed its cap: later bytes are dropped by the init (reported once per stream). */
  onTruncated?: (stream: 'stdout' | 'stderr') => void;
}

export type CommandOutcome =
  /** exitCode: the exit status, or 128 + signal, from the init's own waitpid. */
  | { kind: 'exit'; exitCode: number; waitStatus: number }
  /** The init could not start the command (fork or pipe failed, a malformed request). */
  | { kind: 'refused'; message: string };

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
 * Runs one command through the init listening at `socketPath` and resolves with its
 * outcome once it exited and its output was drained. Rejects with InitLostError when the
 * init cannot be reached or the connection ends without an outcome. `signal` drops the
 * connection, which makes the init kill the command's process group.
 */
export async function runCommand(
  socketPath: string,
  request: Omit<SpawnRequest, 'hasStdin'> & { stdin?: Buffer },
  handlers: CommandHandlers = {},
  signal?: AbortSignal,
): Promise<CommandOutcome> {
  const socket = await connect(socketPath);
  return new Promise<CommandOutcome>((resolve, reject) => {
    let settled = false;
    const finish = (fn: () => void): void => {
      if (settled) return;
      settled = true;
      signal?.removeEventListener('abort', onAbort);
      socket.destroy();
      fn();
    };
    const onAbort = (): void => finish(() => reject(new InitLostError('command abandoned')));
    if (signal?.aborted) return onAbort();
    signal?.addEventListener('abort', onAbort, { once: true });
    const decoder = new FrameDecoder();
    socket.on('data', (chunk: Buffer) => {
      try {
        decoder.push(chunk, (type, payload) => {
          switch (type) {
            case Frame.started:
              handlers.onStarted?.(payload.readUInt32LE(0));
              break;
            case Frame.stdout:
            case Frame.stderr:
              handlers.onOutput?.(type === Frame.stdout ? 'stdout' : 'stderr', payload);
              break;
            case Frame.truncated:
              handlers.onTruncated?.(payload[0] === 0 ? 'stdout' : 'stderr');
              break;
            case Frame.exit:
              finish(() => resolve({ kind: 'exit', exitCode: payload.readInt32LE(0), waitStatus: payload.readInt32LE(4) }));
              break;
            case Frame.error:
              finish(() => resolve({ kind: 'refused', message: payload.toString('utf8') }));
              break;
            default:
              throw new Error(`unexpected frame type ${type}`);
          }
        });
      } catch (err) {
        finish(() => reject(new InitLostError(`bad frame from the sandbox init: ${(err as Error).message}`)));
      }
    });
    socket.on('error', (err) => finish(() => reject(new InitLostError(`connection to the sandbox init failed: ${err.message}`))));
    socket.on('close', () => finish(() => reject(new InitLostError('the sandbox init closed the connection before the command ended'))));
    socket.write(encodeSpawn({ ...request, hasStdin: request.stdin !== undefined }));
    if (request.stdin !== undefined) void writeStdin(socket, request.stdin);
  });
}

/** Stdin in chunks, respecting the socket's backpressure (the init stops reading while the command does not). */
async function writeStdin(socket: net.Socket, stdin: Buffer): Promise<void> {
  for (let off = 0; off < stdin.length && !socket.destroyed; off += STDIN_CHUNK_BYTES) {
    if (!socket.write(frame(Frame.stdin, stdin.subarray(off, off + STDIN_CHUNK_BYTES)))) {
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
  if (!socket.destroyed) socket.write(frame(Frame.stdinEof));
}
