import { createHash } from 'node:crypto';
import type { Readable } from 'node:stream';
import { Worker } from 'node:worker_threads';
import { RollboxError, isErrorCode } from '../api/index.ts';
import { extractTarSafely, type ExtractLimits } from './extract.ts';
import { writeErofsLayerFromTar, type SplitLayerFiles } from './tar-erofs/index.ts';

/**
 * Where a layer tar goes: extracted into a tree (`root`, for mkfs.erofs to build from), or
 * written straight into a split EROFS layer's files (see src/layers/tar-erofs).
 */
export type LayerTarget = { kind: 'tree'; root: string } | { kind: 'erofs'; files: SplitLayerFiles };

/** What reading a layer tar answers: the sha256 hex of the decompressed tar, and an `erofs` target's chunk table. */
export interface TarRead {
  tarSha256: string;
  table?: Buffer;
}

/** How a tar is read: as an image layer, or (`erofs` targets only) as an overlay upper dir with paths left out (TarErofsOptions). */
export interface TarReadOptions {
  imageLayer?: boolean;
  upperDir?: boolean;
  excludePaths?: readonly string[];
}

/** Reads a layer tar (plain, gzip or zstd) into `target`. */
export type TarExtractor = (input: Readable, target: LayerTarget, limits: ExtractLimits, options: TarReadOptions) => Promise<TarRead>;

/** In the calling thread (tests, the base layer at start; a gateway uses ExtractWorkers). */
export const extractInThread: TarExtractor = async (input, target, limits, options) => {
  const hash = createHash('sha256');
  const read = { ...options, onTarChunk: (c: Buffer) => hash.update(c) };
  if (target.kind === 'tree') {
    if (options.upperDir || options.excludePaths?.length) throw new RollboxError('internal', 'an upper dir tar is read only into an EROFS layer');
    await extractTarSafely(input, target.root, limits, read);
    return { tarSha256: hash.digest('hex') };
  }
  const table = await writeErofsLayerFromTar(input, target.files, limits, read);
  return { tarSha256: hash.digest('hex'), table };
};

export type ToExtractThread =
  | { type: 'start'; id: number; target: LayerTarget; limits: ExtractLimits; options: TarReadOptions }
  | { type: 'chunk'; id: number; chunk: ArrayBuffer }
  | { type: 'end' | 'abort'; id: number };
export type FromExtractThread = { type: 'ack'; id: number } | { type: 'done'; id: number; tarSha256: string; table?: Uint8Array } | { type: 'error'; id: number; code: string; message: string };

/** Pieces sent and not yet taken by the thread (about 1 MiB): the rest of the upload waits. */
const MAX_CHUNKS_IN_FLIGHT = 4;
const SEND_BYTES = 256 * 1024;
const THREAD_ENTRY = new URL('./extract-thread.mjs', import.meta.url);
const IDLE_THREAD_MS = 60_000;

interface Slot {
  worker: Worker;
  /** Its thread failed or exited: never handed out again. */
  dead?: boolean;
  /** While idle: ends the thread when no job came for a while (a thread holds tens of MiB). */
  idleTimer?: NodeJS.Timeout;
  /** The job running on it: its acks, its end. */
  current?: { id: number; onAck: () => void; settle: (msg: FromExtractThread | Error) => void };
}

/**
 * Layer tars read off the event loop: a few worker threads, each reading one tar at a
 * time (tens of thousands of small synchronous file system calls per layer would otherwise
 * stall every request the gateway serves meanwhile). The calling thread only forwards the
 * upload's chunks, with backpressure; a thread that dies fails its job and is replaced.
 */
export class ExtractWorkers {
  private readonly idle: Slot[] = [];
  private readonly waiting: ((slot: Slot) => void)[] = [];
  private started = 0;
  private nextId = 1;
  private closed = false;

  constructor(private readonly size = 2) {}

  readonly extract: TarExtractor = async (input, target, limits, options) => {
    const slot = await this.take();
    const id = this.nextId++;
    let inFlight = 0;
    let wake: (() => void) | undefined;
    let failure: Error | undefined;
    const result = new Promise<TarRead>((resolve, reject) => {
      slot.current = {
        id,
        onAck: () => {
          inFlight--;
          wake?.();
        },
        settle: (outcome) => {
          slot.current = undefined;
          if (!(outcome instanceof Error) && outcome.type === 'done') resolve({ tarSha256: outcome.tarSha256, ...(outcome.table ? { table: Buffer.from(outcome.table) } : {}) });
          else {
            failure = outcome instanceof Error ? outcome : outcome.type === 'error' && isErrorCode(outcome.code) ? new RollboxError(outcome.code, outcome.message) : new RollboxError('internal', 'unexpected message from the extraction thread');
            reject(failure);
          }
          wake?.();
        },
      };
    });
    result.catch(() => undefined); // awaited below
    try {
      try {
        slot.worker.postMessage({ type: 'start', id, target, limits, options } satisfies ToExtractThread);
        // Sent in pieces of about SEND_BYTES (a socket gives 16-64 KiB): each message costs both threads a wakeup.
        let gathered: Buffer[] = [];
        let gatheredBytes = 0;
        const send = async (): Promise<void> => {
          while (inFlight >= MAX_CHUNKS_IN_FLIGHT && !failure) await new Promise<void>((r) => (wake = r));
          if (failure || gatheredBytes === 0) return;
          inFlight++;
          // A copy of its own, handed over (the input's buffers may be pooled or still in use).
          const copy = new ArrayBuffer(gatheredBytes);
          const view = new Uint8Array(copy);
          let at = 0;
          for (const b of gathered) {
            view.set(b, at);
            at += b.length;
          }
          gathered = [];
          gatheredBytes = 0;
          slot.worker.postMessage({ type: 'chunk', id, chunk: copy } satisfies ToExtractThread, [copy]);
        };
        for await (const chunk of input as AsyncIterable<Buffer>) {
          gathered.push(chunk);
          gatheredBytes += chunk.length;
          if (gatheredBytes >= SEND_BYTES) await send();
          if (failure) break; // the thread refused the tar: the rest of the upload is not needed
        }
        await send();
        slot.worker.postMessage({ type: 'end', id } satisfies ToExtractThread);
      } catch (err) {
        // The upload failed: the thread stops its job, and the slot goes back once it has.
        slot.worker.postMessage({ type: 'abort', id } satisfies ToExtractThread);
        await result.catch(() => undefined);
        throw err;
      }
      return await result;
    } finally {
      input.destroy();
      this.give(slot);
    }
  };

  /** Ends the threads (a gateway stopping). */
  async close(): Promise<void> {
    this.closed = true;
    await Promise.all(
      this.idle.splice(0).map((s) => {
        clearTimeout(s.idleTimer);
        return s.worker.terminate();
      }),
    );
  }

  private take(): Promise<Slot> {
    const slot = this.idle.pop();
    if (slot) {
      clearTimeout(slot.idleTimer);
      return Promise.resolve(slot);
    }
    if (this.started < this.size) {
      this.started++;
      return Promise.resolve(this.spawn());
    }
    return new Promise((resolve) => this.waiting.push(resolve));
  }

  private give(slot: Slot): void {
    if (this.closed) {
      void slot.worker.terminate();
      return;
    }
    const next = this.waiting.shift();
    if (slot.dead) {
      // Its place goes to a new thread, for whoever waits.
      this.started--;
      if (next) void this.take().then(next);
      return;
    }
    if (next) {
      next(slot);
      return;
    }
    this.idle.push(slot);
    slot.idleTimer = setTimeout(() => {
      const at = this.idle.indexOf(slot);
      if (at < 0) return;
      this.idle.splice(at, 1);
      this.started--;
      slot.dead = true;
      void slot.worker.terminate();
    }, IDLE_THREAD_MS).unref();
  }

  private spawn(): Slot {
    const slot: Slot = { worker: new Worker(THREAD_ENTRY) };
    slot.worker.unref(); // an idle thread never keeps the process alive
    slot.worker.on('message', (msg: FromExtractThread) => {
      const job = slot.current;
      if (!job || job.id !== msg.id) return;
      if (msg.type === 'ack') job.onAck();
      else job.settle(msg);
    });
    const lost = (why: string): void => {
      if (slot.dead) return;
      slot.dead = true;
      const job = slot.current;
      job?.settle(new RollboxError('internal', `layer extraction thread ${why}`));
      // Idle: gone from the pool now. Busy: its job gives it back, and it is replaced then.
      const at = this.idle.indexOf(slot);
      if (at >= 0) {
        this.idle.splice(at, 1);
        this.started--;
      }
    };
    slot.worker.on('error', (err) => lost(`failed: ${err.message}`));
    slot.worker.on('exit', (code) => {
      if (!this.closed) lost(`exited (${code})`);
    });
    return slot;
  }
}
