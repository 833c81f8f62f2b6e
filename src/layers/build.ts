import { execFile } from 'node:child_process';
import { createReadStream } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import type { Readable } from 'node:stream';
import { promisify } from 'node:util';
import tar from 'tar-stream';
import { RollboxError } from '../api/index.ts';
import { mkfsErofs } from './erofs.ts';
import { extractInThread, type TarExtractor } from './extract-workers.ts';
import { LAYER_CHUNK_BYTES } from './split.ts';
import type { LayerStore, StoredLayer } from './store.ts';

export interface BuildLayerOptions {
  store: LayerStore;
  /** Scratch space; a private subdirectory is created and always removed. Same filesystem as the store is fastest. */
  tmpDir: string;
  /** Cap on the total bytes of file contents in the tar. */
  maxBytes: number;
  /** Cap on the number of tar entries (default 200 000). */
  maxEntries?: number;
  mkfsBinary?: string;
  /** Default: in this thread (a gateway passes its ExtractWorkers). */
  extract?: TarExtractor;
  /** Default `direct`. */
  build?: LayerBuildMode;
}

/**
 * How a layer tar becomes a split EROFS layer: `direct` writes the EROFS files from the tar
 * stream (src/layers/tar-erofs: nothing extracted, each byte written once), `extract`
 * extracts the tree with the safe extractor and runs mkfs.erofs on it (the older way,
 * kept for operators who want erofs-utils to have made every image).
 */
export type LayerBuildMode = 'direct' | 'extract';

/** Where a layer being built keeps its files before they move into the store. */
export function splitFilesIn(workDir: string): { metaPath: string; blobPath: string; chunkSizeBytes: number } {
  return { metaPath: path.join(workDir, 'layer.meta'), blobPath: path.join(workDir, 'layer.blob'), chunkSizeBytes: LAYER_CHUNK_BYTES };
}

/** Cap on a layer tar's entries when the caller sets none. */
export const DEFAULT_MAX_ENTRIES = 200_000;

/** Builds a layer from a tar stream and stores it (what the gateway hands its routes and batch grading). */
export type LayerBuilder = (tar: Readable, options: { maxBytes: number }) => Promise<{ digest: string; sizeBytes: number }>;

/**
 * Turn a tar (stream or file path; plain or gzip) into a stored EROFS layer. The same tar
 * gives the same digest on a machine: ownership and mtimes come from the tar, directories
 * the tar leaves implicit get mode 0755 and mtime 0, and the image build is deterministic.
 */
export async function buildLayerFromTar(source: Readable | string, opts: BuildLayerOptions): Promise<StoredLayer> {
  const input = typeof source === 'string' ? createReadStream(source) : source;
  await mkdir(opts.tmpDir, { recursive: true });
  const work = await mkdtemp(path.join(opts.tmpDir, 'layer-'));
  try {
    const limits = { maxBytes: opts.maxBytes, maxEntries: opts.maxEntries ?? DEFAULT_MAX_ENTRIES };
    if ((opts.build ?? 'direct') === 'direct') {
      const files = splitFilesIn(work);
      const { table } = await (opts.extract ?? extractInThread)(input, { kind: 'erofs', files }, limits, {});
      return await opts.store.putSplit({ ...files, ...(table ? { table } : {}) });
    }
    const root = path.join(work, 'root');
    await mkdir(root, { mode: 0o755 });
    await (opts.extract ?? extractInThread)(input, { kind: 'tree', root }, limits, {});
    return await storeTreeAsLayer(root, work, opts.store, opts.mkfsBinary ? { mkfsBinary: opts.mkfsBinary } : {});
  } finally {
    input.destroy();
    await rm(work, { recursive: true, force: true });
  }
}

/**
 * The one way an extracted tree becomes a layer (uploads, image imports): a split EROFS
 * layer (metadata image + data blob in LAYER_CHUNK_BYTES chunks, see LayerStore) built in
 * `workDir` and moved into the store.
 */
export async function storeTreeAsLayer(root: string, workDir: string, store: Pick<LayerStore, 'putSplit'>, opts: { keepXattrs?: boolean; mkfsBinary?: string } = {}): Promise<StoredLayer & { added: boolean }> {
  const files = splitFilesIn(workDir);
  await mkfsErofs(root, files.metaPath, { ...opts, blob: { path: files.blobPath, chunkSizeBytes: files.chunkSizeBytes } });
  // A tree without file contents gets no blob from mkfs: an empty one is the same device.
  await writeFile(files.blobPath, '', { flag: 'a' });
  return store.putSplit(files);
}

export interface BusyboxBaseOptions {
  store: LayerStore;
  tmpDir: string;
  /** A static busybox binary (default /bin/busybox). */
  busyboxPath?: string;
  mkfsBinary?: string;
  build?: LayerBuildMode;
}

const PASSWD = 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n';
const GROUP = 'root:x:0:\nnobody:x:65534:\n';
/** A sandbox's /etc/hosts as images built here ship it (an agent sandbox's gets the gateway's name added). */
export const HOSTS_FILE = '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n';

/**
 * The minimal base: busybox and a symlink per applet, plus the few files programs expect.
 * Built as a tar in memory and fed through the same safe path as uploaded layers, with
 * every timestamp at 0, so the digest only changes when the busybox binary does.
 */
export async function buildBusyboxBase(opts: BusyboxBaseOptions): Promise<StoredLayer> {
  const { tar: pack, binaryBytes } = await busyboxBaseTar(opts.busyboxPath);
  return buildLayerFromTar(pack, {
    store: opts.store,
    tmpDir: opts.tmpDir,
    maxBytes: binaryBytes + 1024 * 1024,
    ...(opts.mkfsBinary ? { mkfsBinary: opts.mkfsBinary } : {}),
    ...(opts.build ? { build: opts.build } : {}),
  });
}

/** The busybox base as a tar stream (what `buildBusyboxBase` stores; bench:build gives Docker the same base). */
export async function busyboxBaseTar(busyboxPath = '/bin/busybox'): Promise<{ tar: Readable; binaryBytes: number }> {
  const binary = await readFile(busyboxPath);
  const { stdout } = await promisify(execFile)(busyboxPath, ['--list-full'], { maxBuffer: 1 << 20 });
  const applets = [...new Set(stdout.split('\n').map((l) => l.trim()).filter((l) => l !== '' && l !== 'bin/busybox'))].sort();
  if (applets.length === 0) throw new RollboxError('internal', `${busyboxPath} --list-full printed no applets`);

  const pack = tar.pack();
  const at = new Date(0);
  const dir = (name: string, mode = 0o755): void => {
    pack.entry({ name, type: 'directory', mode, mtime: at, uid: 0, gid: 0 });
  };
  const file = (name: string, content: string | Buffer, mode = 0o644): void => {
    pack.entry({ name, type: 'file', mode, mtime: at, uid: 0, gid: 0 }, content);
  };
  const dirs = new Set<string>(['bin', 'sbin', 'usr', 'usr/bin', 'usr/sbin', 'etc', 'proc', 'sys', 'dev', 'root', 'tmp', 'home', 'var', 'run', '.rollbox']);
  for (const a of applets) {
    const parts = a.split('/');
    for (let i = 1; i < parts.length; i++) dirs.add(parts.slice(0, i).join('/'));
  }
  for (const d of [...dirs].sort()) dir(`${d}/`, d === 'tmp' ? 0o1777 : d === 'root' ? 0o700 : 0o755);
  file('bin/busybox', binary, 0o755);
  for (const a of applets) pack.entry({ name: a, type: 'symlink', linkname: '/bin/busybox', mode: 0o777, mtime: at, uid: 0, gid: 0 });
  file('etc/passwd', PASSWD);
  file('etc/group', GROUP);
  file('etc/hosts', HOSTS_FILE);
  file('etc/resolv.conf', '');
  file('etc/hostname', 'sandbox\n');
  // Mount target for the runtime's read-only busybox bind (the container init), so runc
  // does not have to create it in each sandbox's writable layer.
  file('.rollbox/busybox', '', 0o755);
  pack.finalize();
  return { tar: pack as unknown as Readable, binaryBytes: binary.length };
}
