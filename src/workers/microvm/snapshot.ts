import { performance } from 'node:perf_hooks';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { RollboxError } from '../../api/index.ts';
import type { TarExtractor } from '../../layers/index.ts';
import { MuxKind, type VmChannel } from './channel.ts';
import { ResultStatus } from './requests.ts';

/** How the guest packs (guest/vminit.h SNAP_*): frozen while staging, frozen throughout, or frozen already (a pause). */
export const SnapshotMode = { staged: 1, frozen: 2, held: 3 } as const;
type SnapshotMode = (typeof SnapshotMode)[keyof typeof SnapshotMode];

export interface VmSnapshotLimits {
  /** Cap on the file contents in the stream (the sandbox's disk: its upper dir cannot hold more, sparse files aside). */
  maxBytes: number;
  maxEntries: number;
  /** The guest sent nothing for this long: the request is dropped. */
  idleTimeoutMs: number;
}

export interface VmSnapshot {
  /** How long the guest kept the sandbox frozen, attempts added (0: it was paused already). */
  frozenMs: number;
  /** The split layer's chunk table (LayerStore.putSplit). */
  table: Buffer;
  entries: number;
  /** Sockets and device nodes: no layer holds them. */
  skipped: number;
  /** The last attempt's phases: asked to first byte (sync, freeze, walk), to the end of the stream; its tar's bytes. */
  firstByteMs: number;
  streamMs: number;
  tarBytes: number;
}

/** The guest's result record (guest/snapshot.c). */
interface GuestResult {
  status: number;
  entries: number;
  skipped: number;
  frozenUs: number;
  tarBytes: number;
  message: string;
}

function parseResult(r: Buffer): GuestResult {
  if (r.length < 28) throw new RollboxError('snapshot_failed', `the microVM's guest answered a snapshot with ${r.length} bytes of result`);
  return { status: r.readUInt32LE(0), entries: r.readUInt32LE(4), skipped: r.readUInt32LE(8), frozenUs: Number(r.readBigUInt64LE(12)), tarBytes: Number(r.readBigUInt64LE(20)), message: r.subarray(28).toString('utf8') };
}

function requestBody(mode: SnapshotMode, maxEntries: number, excludePaths: readonly string[]): Buffer {
  const head = Buffer.alloc(8);
  head.writeUInt32LE(mode, 0);
  head.writeUInt32LE(maxEntries, 4);
  return Buffer.concat([head, ...excludePaths.map((p) => Buffer.from(`${p}\0`, 'utf8'))]);
}

/**
 * pack_diff of a microVM: its guest streams the overlay's upper dir as a tar over the
 * channel (guest/snapshot.c), written straight into a split EROFS layer by the same
 * reader an uploaded layer goes through (src/layers/tar-erofs, layer-entry.ts checks),
 * as an `upper` tar: 0:0 whiteouts and opaque marks as overlayfs keeps them. The host
 * never mounts the disk the guest wrote; the stream is untrusted input, capped in bytes
 * and entries and given up when the guest goes silent. Excluded paths are left out by
 * the guest and dropped here again.
 *
 * First with the sandbox frozen only while the guest stages the tree (hard links); if a
 * staged file changed before it was read, again frozen throughout. `held`: the sandbox is
 * frozen already (a paused VM) and stays so. On any failure nothing is left of `files`
 * (`removeFiles`), and the guest's side thaws the sandbox whatever happened.
 */
export async function snapshotVm(
  channel: VmChannel,
  files: { metaPath: string; blobPath: string; chunkSizeBytes: number },
  options: { excludePaths: readonly string[]; held: boolean; removeFiles: () => Promise<void> },
  limits: VmSnapshotLimits,
  extract: TarExtractor,
): Promise<VmSnapshot> {
  const excludePaths = options.excludePaths.map((p) => p.replace(/^\/+/, '').replace(/\/+$/, '')).filter(Boolean);
  let frozenUs = 0;
  try {
    for (const mode of options.held ? [SnapshotMode.held] : [SnapshotMode.staged, SnapshotMode.frozen]) {
      await options.removeFiles();
      const got = await attempt(channel, files, requestBody(mode, limits.maxEntries, excludePaths), excludePaths, limits, extract);
      frozenUs += got.result.frozenUs;
      if (got.result.status === ResultStatus.ok && got.table) return { frozenMs: frozenUs / 1000, table: got.table, entries: got.result.entries, skipped: got.result.skipped, firstByteMs: got.firstByteMs, streamMs: got.streamMs, tarBytes: got.result.tarBytes };
    }
    throw new RollboxError('snapshot_failed', 'the microVM\'s writable layer kept changing while it was packed frozen');
  } catch (err) {
    await options.removeFiles();
    throw err;
  }
}

async function attempt(
  channel: VmChannel,
  files: { metaPath: string; blobPath: string; chunkSizeBytes: number },
  body: Buffer,
  excludePaths: readonly string[],
  limits: VmSnapshotLimits,
  extract: TarExtractor,
): Promise<{ result: GuestResult; table?: Buffer; firstByteMs: number; streamMs: number }> {
  const askedAt = performance.now();
  let firstByteAt: number | undefined;
  const req = channel.request(MuxKind.snapshot, body);
  let stalled: RollboxError | undefined;
  let timer: NodeJS.Timeout | undefined;
  const watch = (): void => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      stalled = new RollboxError('snapshot_failed', `the microVM's guest sent nothing for ${limits.idleTimeoutMs} ms of its snapshot; nothing was stored`);
      req.cancel();
    }, limits.idleTimeoutMs);
  };
  const meter = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      firstByteAt ??= performance.now();
      watch();
      cb(null, chunk);
    },
  });
  watch();
  const piped = pipeline(req.data, meter).catch(() => undefined); // its failures surface in the reader and the result
  const reading = extract(meter, { kind: 'erofs', files }, { maxBytes: limits.maxBytes, maxEntries: limits.maxEntries }, { upperDir: true, excludePaths }).catch((err: unknown) => {
    req.cancel(); // the rest is not wanted: the guest's side ends (and thaws)
    throw err;
  });
  const [read, result] = await Promise.allSettled([reading, req.result]);
  clearTimeout(timer);
  await piped;
  if (stalled) throw stalled;
  const firstByteMs = (firstByteAt ?? askedAt) - askedAt;
  const streamMs = performance.now() - (firstByteAt ?? askedAt);
  if (result.status === 'fulfilled') {
    const r = parseResult(result.value);
    if (r.status === ResultStatus.changed) return { result: r, firstByteMs, streamMs };
    if (r.status !== ResultStatus.ok) throw new RollboxError(r.status === ResultStatus.tooLarge ? 'payload_too_large' : 'snapshot_failed', `the microVM's guest could not pack its writable layer: ${r.message}`);
    if (read.status === 'fulfilled') return { result: r, table: read.value.table!, firstByteMs, streamMs };
  }
  if (read.status === 'rejected') throw refused(read.reason);
  throw new RollboxError('snapshot_failed', `the microVM's snapshot stream ended without its result (${(result as PromiseRejectedResult).reason?.message ?? 'no reason'}); nothing was stored`);
}

/** The reader's refusal as the snapshot's: caps stay payload_too_large, the rest says the guest's stream was refused. */
function refused(err: unknown): RollboxError {
  if (err instanceof RollboxError && err.code === 'payload_too_large') return new RollboxError('payload_too_large', `the microVM's snapshot: ${err.message}`);
  const message = err instanceof Error ? err.message : String(err);
  return new RollboxError('snapshot_failed', `the microVM's snapshot stream was refused: ${message}; nothing was stored`);
}
