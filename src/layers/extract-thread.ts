/**
 * A layer tar worker thread: takes one tar at a time as chunks from its parent
 * (extract-workers.ts), reads it into its target (a tree or a split EROFS layer), and
 * answers the sha256 of the (decompressed) tar. Chunks are acknowledged as the extraction pulls them, which is the
 * parent's backpressure.
 */
import { closeSync, openSync } from 'node:fs';
import { Readable } from 'node:stream';
import { parentPort } from 'node:worker_threads';
import { RollboxError } from '../api/index.ts';
import { extractFromFd, extractInThread, type FromExtractThread, type ToExtractThread } from './extract-workers.ts';

const port = parentPort!;
const post = (msg: FromExtractThread): void => port.postMessage(msg);

interface Job {
  id: number;
  input: Readable;
  pending: Buffer[];
  ended: boolean;
  wantsData: boolean;
}
let job: Job | undefined;

function pump(j: Job): void {
  while (j.wantsData && j.pending.length > 0) {
    post({ type: 'ack', id: j.id });
    j.wantsData = j.input.push(j.pending.shift());
  }
  if (j.wantsData && j.ended && j.pending.length === 0 && !j.input.readableEnded) j.input.push(null);
}

port.on('message', (msg: ToExtractThread) => {
  if (msg.type === 'start' && msg.fifo !== undefined && msg.target.kind === 'erofs') {
    const { id, fifo, target, limits, options } = msg;
    let fd: number | undefined;
    // Waits for the decompressor's shell to open the other end, then reads it to its end, synchronously.
    void (async () => {
      try {
        fd = openSync(fifo, 'r');
        const read = await extractFromFd(fd, target.files, limits, options);
        post({ type: 'done', id, tarSha256: read.tarSha256, ...(read.table ? { table: new Uint8Array(read.table) } : {}) });
      } catch (err) {
        post({ type: 'error', id, code: err instanceof RollboxError ? err.code : 'internal', message: err instanceof Error ? err.message : String(err) });
      } finally {
        // Closed at once: a decompressor still writing ends (SIGPIPE).
        if (fd !== undefined) closeSync(fd);
      }
    })();
    return;
  }
  if (msg.type === 'start') {
    const j: Job = { id: msg.id, pending: [], ended: false, wantsData: false, input: new Readable({ read: () => { j.wantsData = true; pump(j); } }) };
    job = j;
    extractInThread(j.input, msg.target, msg.limits, msg.options).then(
      (read) => post({ type: 'done', id: j.id, tarSha256: read.tarSha256, ...(read.table ? { table: new Uint8Array(read.table) } : {}) }),
      (err: unknown) => post({ type: 'error', id: j.id, code: err instanceof RollboxError ? err.code : 'internal', message: err instanceof Error ? err.message : String(err) }),
    );
    return;
  }
  const j = job;
  if (!j || j.id !== msg.id) return; // a late message of a finished job
  if (msg.type === 'chunk') j.pending.push(Buffer.from(msg.chunk));
  else if (msg.type === 'end') j.ended = true;
  else j.input.destroy(new RollboxError('invalid_layer', 'the upload stopped before its end'));
  pump(j);
});
