/**
 * The wire format between a worker host and a sandbox's init (rollbox-init.c): frames of
 * an 8-byte header (u8 type, 3 zero bytes, u32 little-endian payload length) and a payload.
 * One connection carries one command: a SPAWN, or an ATTACH to a durable command a
 * previous connection spawned (see rollbox-init.c).
 */
export const Frame = {
  spawn: 1,
  stdin: 2,
  stdinEof: 3,
  attach: 4,
  signal: 5,
  forget: 6,
  release: 7,
  resize: 8,
  started: 16,
  stdout: 17,
  stderr: 18,
  truncated: 19,
  exit: 20,
  error: 21,
  attached: 22,
  unknown: 23,
  released: 24,
} as const;

const HEADER_BYTES = 8;
/** The init refuses larger frames; stdin goes in chunks far below this. */
export const MAX_FRAME_BYTES = 16 << 20;
export const STDIN_CHUNK_BYTES = 64 * 1024;
const SPAWN_HAS_STDIN = 1;
const SPAWN_HAS_USER = 2;
const SPAWN_DURABLE = 4;
const SPAWN_PTY = 8;
/**
 * A SPAWN's exec cgroup "chosen by the init" (AUTO_SLOT): an idle one, or one it makes. A
 * microVM's host cannot see the guest's cgroups, so its guest's init picks and counts.
 */
export const AUTO_SLOT = '*';

export function frame(type: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  const header = Buffer.alloc(HEADER_BYTES);
  header[0] = type;
  header.writeUInt32LE(payload.length, 4);
  return Buffer.concat([header, payload]);
}

export interface SpawnRequest {
  argv: readonly string[];
  /** Added to (and replacing entries of) the sandbox's own environment. */
  env: Record<string, string>;
  cwd: string;
  /** Who the command runs as (`name`, `uid`, `name:group`, `uid:gid`), resolved by the init; none: root. */
  user?: string;
  /** Exec cgroup the command joins before it execs ('' for none). */
  slot: string;
  hasStdin: boolean;
  stdoutCapBytes: number;
  stderrCapBytes: number;
  oomScoreAdj: number;
  /** The command outlives its connection for `graceMs`, addressable by `commandId` (ATTACH). */
  durable?: { commandId: string; graceMs: number };
  /** Run on a pseudo-terminal of this size (its controlling terminal; one output stream, stdout). Needs `hasStdin`. */
  pty?: PtySize;
}

/** A terminal's size in character cells (the init takes 1..65535 each). */
export interface PtySize {
  cols: number;
  rows: number;
}

function encodePtySize(size: PtySize): Buffer {
  const body = Buffer.alloc(4);
  body.writeUInt16LE(size.cols, 0);
  body.writeUInt16LE(size.rows, 2);
  return body;
}

export function encodeSpawn(r: SpawnRequest): Buffer {
  const env = Object.entries(r.env).map(([k, v]) => `${k}=${v}`);
  const head = Buffer.alloc(24);
  head.writeUInt32LE((r.hasStdin ? SPAWN_HAS_STDIN : 0) | (r.user === undefined ? 0 : SPAWN_HAS_USER) | (r.durable ? SPAWN_DURABLE : 0) | (r.pty ? SPAWN_PTY : 0), 0);
  head.writeUInt32LE(Math.min(r.stdoutCapBytes, 0xffff_ffff), 4);
  head.writeUInt32LE(Math.min(r.stderrCapBytes, 0xffff_ffff), 8);
  head.writeInt32LE(r.oomScoreAdj, 12);
  head.writeUInt32LE(r.argv.length, 16);
  head.writeUInt32LE(env.length, 20);
  // The user, when there is one, follows the env strings, then a durable command's id and
  // its grace, then a pty's size (spawn.c's parse_spawn).
  const strings = [r.slot, r.cwd, ...r.argv, ...env, ...(r.user === undefined ? [] : [r.user]), ...(r.durable ? [r.durable.commandId] : [])].map((s) => `${s}\0`).join('');
  const grace = Buffer.alloc(r.durable ? 4 : 0);
  if (r.durable) grace.writeUInt32LE(Math.min(Math.max(0, Math.round(r.durable.graceMs)), 0xffff_ffff), 0);
  return frame(Frame.spawn, Buffer.concat([head, Buffer.from(strings, 'utf8'), grace, r.pty ? encodePtySize(r.pty) : Buffer.alloc(0)]));
}

/** ATTACH: the durable command's output frames from byte `fromOffset` of its log, then live, then EXIT. */
export function encodeAttach(commandId: string, fromOffset = 0): Buffer {
  const head = Buffer.alloc(8);
  head.writeBigUInt64LE(BigInt(fromOffset), 0);
  return frame(Frame.attach, Buffer.concat([head, Buffer.from(`${commandId}\0`, 'utf8')]));
}

export function encodeSignal(signo: number): Buffer {
  const body = Buffer.alloc(4);
  body.writeUInt32LE(signo, 0);
  return frame(Frame.signal, body);
}

/** RESIZE: a pty command's new window size. */
export function encodeResize(size: PtySize): Buffer {
  return frame(Frame.resize, encodePtySize(size));
}

/** Splits a byte stream into frames as they complete. */
export class FrameDecoder {
  private pending: Buffer = Buffer.alloc(0);

  push(chunk: Buffer, onFrame: (type: number, payload: Buffer) => void): void {
    this.pending = this.pending.length ? Buffer.concat([this.pending, chunk]) : chunk;
    let off = 0;
    while (this.pending.length - off >= HEADER_BYTES) {
      const len = this.pending.readUInt32LE(off + 4);
      if (len > MAX_FRAME_BYTES) throw new Error(`frame of ${len} bytes from the init`);
      if (this.pending.length - off < HEADER_BYTES + len) break;
      const type = this.pending[off]!;
      onFrame(type, this.pending.subarray(off + HEADER_BYTES, off + HEADER_BYTES + len));
      off += HEADER_BYTES + len;
    }
    this.pending = off === this.pending.length ? Buffer.alloc(0) : this.pending.subarray(off);
  }
}
