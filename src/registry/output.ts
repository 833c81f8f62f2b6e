import type { Redis } from 'ioredis';
import { keys } from './keys.ts';

/** Streamed output is for following a command live; the command log keeps the result. */
const OUTPUT_TTL_SEC = 3600;
/** Chunks are coalesced for this long before one XADD, so a chatty command costs few calls. */
const FLUSH_MS = 20;
/** A terminal's: a typed key's echo waits for this flush, so it is short. */
export const INTERACTIVE_FLUSH_MS = 2;
const FLUSH_BYTES = 64 * 1024;

export interface OutputChunk {
  /** Redis stream entry id: the SSE event id a reconnecting client resumes from. */
  id: string;
  stream: 'stdout' | 'stderr';
  data: string;
}

/** Output after some entry, and whether the end of the output was among it. */
export interface OutputRead {
  chunks: OutputChunk[];
  /** The writer's end marker was read: no more output will come (the result is recorded). */
  ended: boolean;
  /** The last entry id read (the marker's included): where the next read starts. */
  lastId: string;
}

/** Appends a command's output, in order, to its Redis stream. */
export class OutputWriter {
  private pending: { stream: 'stdout' | 'stderr'; data: Buffer }[] = [];
  private pendingBytes = 0;
  private timer: NodeJS.Timeout | undefined;
  private chain: Promise<unknown> = Promise.resolve();
  private readonly key: string;

  /** `skipBytes`: output already in the stream (a worker resuming a command another one streamed). */
  constructor(
    private readonly redis: Redis,
    sandboxId: string,
    commandId: string,
    private readonly skipBytes: Record<'stdout' | 'stderr', number> = { stdout: 0, stderr: 0 },
    private readonly flushMs = FLUSH_MS,
  ) {
    this.key = keys.commandOutput(sandboxId, commandId);
  }

  /** A writer that goes on where the command's stream stops (its earlier writer's host died). */
  static async resume(redis: Redis, sandboxId: string, commandId: string, flushMs = FLUSH_MS): Promise<OutputWriter> {
    const skip = { stdout: 0, stderr: 0 };
    for (let after = '-'; ; ) {
      const rows = (await redis.xrange(keys.commandOutput(sandboxId, commandId), after === '-' ? '-' : `(${after}`, '+', 'COUNT', 1000)) as [string, string[]][];
      for (const [id, fields] of rows) {
        after = id;
        const map: Record<string, string> = {};
        for (let i = 0; i + 1 < fields.length; i += 2) map[fields[i]!] = fields[i + 1]!;
        if (map.d !== undefined) skip[map.s === 'stderr' ? 'stderr' : 'stdout'] += map.n ? Number(map.n) : Buffer.byteLength(map.d);
      }
      if (rows.length < 1000) return new OutputWriter(redis, sandboxId, commandId, skip, flushMs);
    }
  }

  write(stream: 'stdout' | 'stderr', data: Buffer): void {
    const skip = Math.min(this.skipBytes[stream], data.length);
    if (skip > 0) {
      this.skipBytes[stream] -= skip;
      data = data.subarray(skip);
      if (data.length === 0) return;
    }
    const last = this.pending.at(-1);
    if (last && last.stream === stream) last.data = Buffer.concat([last.data, data]);
    else this.pending.push({ stream, data });
    this.pendingBytes += data.length;
    if (this.pendingBytes >= FLUSH_BYTES) void this.flush();
    else this.timer ??= setTimeout(() => void this.flush(), this.flushMs);
  }

  /**
   * Resolves once everything written so far is in Redis. Entries are UTF-8 text: a
   * character cut at the end of a chunk (a terminal's output comes in any pieces) waits
   * for the next write, unless this is the last flush (`end`).
   */
  flush(final = false): Promise<unknown> {
    clearTimeout(this.timer);
    this.timer = undefined;
    const batch = this.pending;
    this.pending = [];
    this.pendingBytes = 0;
    const last = batch.at(-1);
    const cut = last && !final ? incompleteUtf8Tail(last.data) : 0;
    if (last && cut > 0) {
      this.pending.push({ stream: last.stream, data: last.data.subarray(last.data.length - cut) });
      this.pendingBytes = cut;
      last.data = last.data.subarray(0, last.data.length - cut);
      if (last.data.length === 0) batch.pop();
      this.timer = setTimeout(() => void this.flush(true), this.flushMs);
    }
    if (batch.length > 0) {
      this.chain = this.chain.then(() => {
        const multi = this.redis.multi();
        // n: the chunk's bytes, so a resuming writer knows exactly what is here already.
        for (const { stream, data } of batch) multi.xadd(this.key, '*', 's', stream, 'd', data.toString('utf8'), 'n', String(data.length));
        return multi.expire(this.key, OUTPUT_TTL_SEC).exec();
      });
    }
    return this.chain;
  }

  /** The end marker, written once the result is recorded: it wakes readers blocked on the stream. */
  async end(): Promise<void> {
    await this.flush(true);
    await this.redis.multi().xadd(this.key, '*', 'end', '1').expire(this.key, OUTPUT_TTL_SEC).exec();
  }
}

/** How many bytes at the end of `data` start a UTF-8 character they do not finish (0-3). */
export function incompleteUtf8Tail(data: Buffer): number {
  for (let back = 1; back <= Math.min(3, data.length); back++) {
    const b = data[data.length - back]!;
    if ((b & 0xc0) === 0x80) continue; // a continuation byte: look further back
    const need = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

function parse(rows: [string, string[]][]): OutputRead {
  const read: OutputRead = { chunks: [], ended: false, lastId: '' };
  for (const [id, fields] of rows) {
    read.lastId = id;
    const map: Record<string, string> = {};
    for (let i = 0; i + 1 < fields.length; i += 2) map[fields[i]!] = fields[i + 1]!;
    if (map.end) read.ended = true;
    else read.chunks.push({ id, stream: map.s === 'stderr' ? 'stderr' : 'stdout', data: map.d ?? '' });
  }
  return read;
}

/** Reads a command's output stream after `afterId` (exclusive). */
export async function readOutput(redis: Redis, sandboxId: string, commandId: string, afterId: string, count = 200): Promise<OutputRead> {
  return parse(await redis.xrange(keys.commandOutput(sandboxId, commandId), `(${afterId}`, '+', 'COUNT', count));
}

/**
 * Waits up to `blockMs` for output after `afterId` (XREAD BLOCK: no polling). `blocking`
 * must be a connection nothing else uses meanwhile.
 */
export async function followOutput(blocking: Redis, sandboxId: string, commandId: string, afterId: string, blockMs: number): Promise<OutputRead> {
  const reply = (await blocking.xread('COUNT', 200, 'BLOCK', blockMs, 'STREAMS', keys.commandOutput(sandboxId, commandId), afterId)) as [string, [string, string[]][]][] | null;
  return parse(reply?.[0]?.[1] ?? []);
}
