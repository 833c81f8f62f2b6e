import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { closeSync, constants, openSync } from 'node:fs';
import { open, rm } from 'node:fs/promises';
import { pipeline } from 'node:stream/promises';
import { promisify } from 'node:util';
import type { Readable } from 'node:stream';
import { Worker } from 'node:worker_threads';
import { RollboxError, isErrorCode } from '../api/index.ts';
import { DECOMPRESSOR_ARGV, sniffCompression, type Compression } from './decompress.ts';
import { extractTarSafely, type ExtractLimits } from './extract.ts';
import { writeErofsLayerFromFd, writeErofsLayerFromTar, type SplitLayerFiles } from './tar-erofs/index.ts';

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

/**
 * An `erofs` target from a descriptor giving the decompressed tar (a layer thread's end of a
 * decompressor's FIFO), read synchronously: the thread does nothing else meanwhile.
 */
export async function extractFromFd(fd: number, files: SplitLayerFiles, limits: ExtractLimits, options: TarReadOptions): Promise<TarRead> {
  const hash = createHash('sha256');
  const table = await writeErofsLayerFromFd(fd, files, limits, { ...options, onTarChunk: (c) => hash.update(c) });
  return { tarSha256: hash.digest('hex'), table };
}

export type ToExtractThread =
  /** `fifo`: the decompressed tar comes from this FIFO, not as chunks (an `erofs` target of a compressed tar). */
  | { type: 'start'; id: number; target: LayerTarget; limits: ExtractLimits; options: TarReadOptions; fifo?: string }
  | { type: 'chunk'; id: number; chunk: ArrayBuffer }
  | { type: 'end' | 'abort'; id: number };
export type FromExtractThread = { type: 'ack'; id: number } | { type: 'done'; id: number; tarSha256: string; table?: Uint8Array } | { type: 'error'; id: number; code: string; message: string };

/** Pieces sent and not yet taken by the thread (about 1 MiB): the rest of the upload waits. */
const MAX_CHUNKS_IN_FLIGHT = 4;
const SEND_BYTES = 256 * 1024;
const THREAD_ENTRY = new URL('./extract-thread.mjs', import.meta.url);
const IDLE_THREAD_MS = 60_000;

/** One tar on a thread, as its caller follows it. */
interface Job {
  id: number;
  result: Promise<TarRead>;
  /** Set once the thread refused the tar (or was lost). */
  failure: Error | undefined;
  onAck: () => void;
  onSettle: () => void;
}

const execFileAsync = promisify(execFile);
const isBrokenPipe = (err: unknown): boolean => (err as NodeJS.ErrnoException)?.code === 'EPIPE' || (err as NodeJS.ErrnoException)?.code === 'ERR_STREAM_PREMATURE_CLOSE';

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
 * upload's chunks, with backpressure, or, for a compressed tar bound for an EROFS layer, feeds
 * the decompression tool whose output the thread reads from a FIFO (extractThroughTool). A
 * thread that dies fails its job and is replaced.
 */
export class ExtractWorkers {
  private readonly idle: Slot[] = [];
  private readonly waiting: ((slot: Slot) => void)[] = [];
  private started = 0;
  private nextId = 1;
  private closed = false;

  constructor(private readonly size = 2) {}

  readonly extract: TarExtractor = async (input, target, limits, options) => {
    try {
      if (target.kind !== 'erofs') return await this.extractFromChunks(input, target, limits, options);
      const { compression, stream } = await sniffCompression(input);
      return await (compression ? this.extractThroughTool(stream, compression, target, limits, options) : this.extractFromChunks(stream, target, limits, options));
    } finally {
      input.destroy();
    }
  };

  /** The tar sent to the thread in pieces, as it comes (with backpressure). */
  private async extractFromChunks(input: Readable, target: LayerTarget, limits: ExtractLimits, options: TarReadOptions): Promise<TarRead> {
    const slot = await this.take();
    const job = this.startJob(slot);
    let inFlight = 0;
    let wake: (() => void) | undefined;
    job.onAck = () => {
      inFlight--;
      wake?.();
    };
    job.onSettle = () => wake?.();
    try {
      try {
        slot.worker.postMessage({ type: 'start', id: job.id, target, limits, options } satisfies ToExtractThread);
        // Sent in pieces of about SEND_BYTES (a socket gives 16-64 KiB): each message costs both threads a wakeup.
        let gathered: Buffer[] = [];
        let gatheredBytes = 0;
        const send = async (): Promise<void> => {
          while (inFlight >= MAX_CHUNKS_IN_FLIGHT && !job.failure) await new Promise<void>((r) => (wake = r));
          if (job.failure || gatheredBytes === 0) return;
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
          slot.worker.postMessage({ type: 'chunk', id: job.id, chunk: copy } satisfies ToExtractThread, [copy]);
        };
        for await (const chunk of input as AsyncIterable<Buffer>) {
          gathered.push(chunk);
          gatheredBytes += chunk.length;
          if (gatheredBytes >= SEND_BYTES) await send();
          if (job.failure) break; // the thread refused the tar: the rest of the upload is not needed
        }
        await send();
        slot.worker.postMessage({ type: 'end', id: job.id } satisfies ToExtractThread);
      } catch (err) {
        // The upload failed: the thread stops its job, and the slot goes back once it has.
        slot.worker.postMessage({ type: 'abort', id: job.id } satisfies ToExtractThread);
        await job.result.catch(() => undefined);
        throw err;
      }
      return await job.result;
    } finally {
      input.destroy();
      this.give(slot);
    }
  }

  /**
   * A compressed tar into an `erofs` target: the decompression tool (a process of its own,
   * so another core) reads the tar from this thread and writes into a FIFO that the layer
   * thread reads synchronously in large pieces. The bytes never pass this thread decompressed
   * and the layer thread never handles a stream. The tool's own failure (bad data) is the
   * error when it exited by itself; else the thread's, or the input's.
   */
  private async extractThroughTool(input: Readable, compression: Compression, target: Extract<LayerTarget, { kind: 'erofs' }>, limits: ExtractLimits, options: TarReadOptions): Promise<TarRead> {
    const fifo = `${target.files.metaPath}.fifo`;
    const slot = await this.take();
    let tool: ChildProcess | undefined;
    try {
      await execFileAsync('mkfifo', ['-m', '600', fifo]);
      const job = this.startJob(slot);
      slot.worker.postMessage({ type: 'start', id: job.id, target, limits, options, fifo } satisfies ToExtractThread);
      // The shell opens the FIFO for the tool (an open that waits for the thread's, and the thread's for it).
      // It dies with this process (setpriv's parent-death signal): a gateway killed before its thread opened
      // the FIFO would otherwise leave it waiting there for ever.
      tool = spawn('setpriv', ['--pdeathsig', 'SIGKILL', '--', 'sh', '-c', 'exec "$@" > "$0"', fifo, ...DECOMPRESSOR_ARGV[compression]], { stdio: ['pipe', 'ignore', 'pipe'] });
      let stderr = '';
      tool.stderr!.on('data', (d: Buffer) => void (stderr.length < 1000 && (stderr += d.toString())));
      const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
        tool!.once('close', (code, signal) => resolve({ code, signal }));
        tool!.once('error', () => {
          // Never started: the thread's open of the FIFO gets a writer that closes at once (an open that waits for it, in libuv's pool).
          void open(fifo, 'w').then((h) => h.close(), () => undefined);
          resolve({ code: 127, signal: null });
        });
      });
      const fed = pipeline(input, tool.stdin!).then(
        () => undefined,
        (err: unknown) => err,
      );
      const read = await job.result.then(
        (r) => ({ ok: r }),
        (err: unknown) => ({ err }),
      );
      if ('err' in read) {
        // The thread gave up: the rest of the input and a tool still running are not needed (kill does nothing to one that ended).
        tool.kill('SIGKILL');
        input.destroy();
      }
      const [exit, inputError] = await Promise.all([exited, fed]);
      // The input's own failure (a cut download, an upload stopped) comes before what it made the tool and the thread see.
      if (inputError && !isBrokenPipe(inputError)) throw inputError;
      const toolFailed = exit.signal === null && exit.code !== 0 && !(compression === 'gzip' && exit.code === 2);
      if (toolFailed) throw new RollboxError('invalid_layer', `bad ${compression} data: ${stderr.trim().slice(0, 300) || `${DECOMPRESSOR_ARGV[compression][0]} exited ${exit.code}`}`);
      if ('err' in read) throw read.err;
      if (inputError || exit.signal !== null) throw new RollboxError('internal', `${DECOMPRESSOR_ARGV[compression][0]} ended early (${exit.signal ?? 'its input closed'})`);
      return read.ok;
    } finally {
      tool?.kill('SIGKILL');
      // An open of the FIFO still waiting (its thread lost) ends: O_RDWR is its reader and never waits.
      try {
        closeSync(openSync(fifo, constants.O_RDWR));
      } catch {
        // never made
      }
      input.destroy();
      this.give(slot);
      await rm(fifo, { force: true });
    }
  }

  /** A job on `slot`: its result settles with the thread's answer, or the thread's loss. */
  private startJob(slot: Slot): Job {
    const id = this.nextId++;
    // eslint-disable-next-line prefer-const -- the settle below runs later, once `job` is set
    let job: Job;
    const result = new Promise<TarRead>((resolve, reject) => {
      slot.current = {
        id,
        onAck: () => job.onAck(),
        settle: (outcome) => {
          slot.current = undefined;
          if (!(outcome instanceof Error) && outcome.type === 'done') resolve({ tarSha256: outcome.tarSha256, ...(outcome.table ? { table: Buffer.from(outcome.table) } : {}) });
          else {
            job.failure = outcome instanceof Error ? outcome : outcome.type === 'error' && isErrorCode(outcome.code) ? new RollboxError(outcome.code, outcome.message) : new RollboxError('internal', 'unexpected message from the extraction thread');
            reject(job.failure);
          }
          job.onSettle();
        },
      };
    });
    job = { id, result, failure: undefined, onAck: () => undefined, onSettle: () => undefined };
    job.result.catch(() => undefined); // awaited by the caller
    return job;
  }

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
