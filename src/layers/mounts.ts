import { mkdir, readdir, realpath, rmdir } from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { RollboxError } from '../api/index.ts';
import { hexOfDigest } from './digest.ts';
import { isMountPoint, listLoopDevices, loopBackingFile, loopDeviceOf, readMountInfo, unmount } from './hostmounts.ts';
import type { LayerFiles } from './store.ts';
import { runTool } from '../proc/index.ts';

/** Built from src/layers/gate/rollbox-gate.c by scripts/build-gate.sh (run by `npm start`, `npm test` and the benches). */
export const DEFAULT_GATE_BINARY = path.resolve(import.meta.dirname, '../../build/rollbox-gate');

/** What the host's lazy layers need of the mounts (see src/layers/lazy): the gate marks a blob before its first mount and lets it go after its last. */
export interface LazyBlobHolder {
  attach(files: LayerFiles): Promise<void>;
  detach(digest: string): Promise<void>;
  /** After a reconcile: the layers still mounted here (the blobs of the others are let go). */
  reconcile(mounted: ReadonlySet<string>): Promise<void>;
  /** Whether a mount of this layer a previous worker left is still guarded (the gate kept its blob, or it is complete). */
  canAdopt(digest: string): Promise<boolean>;
}

export interface LayerLogger {
  warn(obj: object, msg?: string): void;
  info?(obj: object, msg?: string): void;
}

export interface LayerMountsDeps {
  /** Mounts live under `<dataDir>/mnt/layers/<hex>`. */
  dataDir: string;
  /** Layer store directory: reconcile detaches stray loop devices backed by images under it. */
  storeDir?: string;
  logger?: LayerLogger;
  mountBinary?: string;
  umountBinary?: string;
  losetupBinary?: string;
  /** Mounts split layers with mount(2) (`device=<blob>`, no loop device); default build/rollbox-gate. */
  gateBinary?: string;
  /** Lazy layers' blobs (a host without the layer store); without it a lazy layer cannot be mounted. */
  lazy?: LazyBlobHolder;
  /**
   * How long a layer no sandbox uses stays mounted (default 0: unmounted at once). A worker
   * host keeps it a while: one-shot sandboxes come and go one at a time, and each would
   * otherwise pay a mount and an unmount of its layers.
   */
  idleUnmountDelayMs?: number;
}

const UNMOUNT_RETRY_MS = 1000;

interface Entry {
  refs: number;
  mounted: boolean;
  /** Mount/unmount operations queued or running; the fast path is only taken when 0. */
  busy: number;
  chain: Promise<void>;
  files: LayerFiles;
  /** Set while an unused layer lingers mounted (idleUnmountDelayMs). */
  idleTimer?: NodeJS.Timeout;
}

/**
 * Reference-counted, read-only mounts of layers, shared by every sandbox on the host: each
 * layer is mounted once at `<dataDir>/mnt/layers/<hex>` and unmounted when its last user
 * releases it (or `idleUnmountDelayMs` later). A split layer is mounted file-backed (its meta
 * image with `device=<blob>`, no loop device); a lazy one only after the gate marked its blob;
 * a single-image layer is loop-mounted (its loop device detached at unmount). Mount and
 * unmount of one digest are serialized, so concurrent acquires mount once and a release
 * racing an acquire never unmounts a layer someone holds.
 */
export class LayerMounts {
  readonly root: string;
  private readonly entries = new Map<string, Entry>();
  private readonly deps: LayerMountsDeps;

  constructor(deps: LayerMountsDeps) {
    this.deps = deps;
    this.root = path.join(path.resolve(deps.dataDir), 'mnt', 'layers');
  }

  dirOf(digest: string): string {
    return path.join(this.root, hexOfDigest(digest));
  }

  /** Digests mounted by this instance right now. */
  mounted(): string[] {
    return [...this.entries.entries()].filter(([, e]) => e.mounted).map(([d]) => d);
  }

  refCount(digest: string): number {
    return this.entries.get(digest)?.refs ?? 0;
  }

  /** Whether a lazy layer is mounted here now (its blob is then held by the gate). */
  isLazyMounted(digest: string): boolean {
    const e = this.entries.get(digest);
    return !!e && e.mounted && e.files.lazy === true;
  }

  /** Take a reference on a layer, mounting it if this is the first; returns its mount directory. */
  async acquire(files: LayerFiles): Promise<string> {
    const { digest } = files;
    const dir = this.dirOf(digest);
    let e = this.entries.get(digest);
    if (!e) {
      e = { refs: 0, mounted: false, busy: 0, chain: Promise.resolve(), files };
      this.entries.set(digest, e);
    }
    e.refs++;
    clearTimeout(e.idleTimer);
    if (e.mounted && e.busy === 0) return dir; // hot path: a refcount bump
    const entry = e;
    try {
      await this.serialize(entry, async () => {
        if (!entry.mounted) {
          await this.mountLayer(files, dir);
          entry.files = files;
          entry.mounted = true;
        }
      });
    } catch (err) {
      entry.refs--;
      this.forgetIfIdle(digest, entry);
      throw err;
    }
    return dir;
  }

  /** Unmount these layers now if nobody holds them (not after the idle delay). */
  async unmountUnused(digests: readonly string[]): Promise<void> {
    for (const digest of digests) {
      const e = this.entries.get(digest);
      if (!e || e.refs > 0) continue;
      clearTimeout(e.idleTimer);
      await this.unmountIfUnused(digest, e);
    }
  }

  /** Drop a reference; the last one unmounts the layer and detaches its loop device. */
  async release(digest: string): Promise<void> {
    const e = this.entries.get(digest);
    if (!e || e.refs === 0) return;
    e.refs--;
    if (e.refs > 0) return;
    if (this.deps.idleUnmountDelayMs) {
      clearTimeout(e.idleTimer);
      e.idleTimer = setTimeout(() => void this.unmountIfUnused(digest, e), this.deps.idleUnmountDelayMs).unref();
      return;
    }
    const dir = this.dirOf(digest);
    try {
      await this.serialize(e, async () => {
        if (e.refs === 0 && e.mounted) {
          await this.unmountDir(dir, false);
          e.mounted = false;
          await this.letGo(e.files);
        }
      });
    } catch (err) {
      // Still busy (the overlay of a container that just died can hold it a while): try
      // again shortly, detaching lazily, so a layer no sandbox uses never stays mounted.
      setTimeout(() => void this.unmountIfUnused(digest, e), UNMOUNT_RETRY_MS).unref();
      throw err;
    } finally {
      this.forgetIfIdle(digest, e);
    }
  }

  private async unmountIfUnused(digest: string, e: Entry): Promise<void> {
    try {
      await this.serialize(e, async () => {
        if (e.refs === 0 && e.mounted) {
          await this.unmountDir(this.dirOf(digest), true);
          e.mounted = false;
          await this.letGo(e.files);
        }
      });
    } catch (err) {
      this.deps.logger?.warn({ digest, err: String(err) }, 'layer still mounted');
    } finally {
      this.forgetIfIdle(digest, e);
    }
  }

  /** After a lazy layer's last unmount (also a lazy detach: the blob's fds stay valid). */
  private async letGo(files: LayerFiles): Promise<void> {
    if (files.lazy) await this.deps.lazy?.detach(files.digest);
  }

  /**
   * Unmount and detach every layer mount under this instance's directory whose digest is
   * neither in `inUse` nor currently referenced, then detach loop devices left bound to
   * images of the store without any mount (a crash between attach and mount). Returns the
   * digests unmounted (the lazy ones among them are the caller's to let go of: this
   * instance may not know them).
   */
  async reconcile(inUse: ReadonlySet<string>): Promise<{ unmounted: string[] }> {
    const unmounted: string[] = [];
    const kept = new Set<string>();
    const names = await readdir(this.root).catch(() => [] as string[]);
    for (const name of names) {
      if (!/^[0-9a-f]{64}$/.test(name)) continue;
      const digest = `sha256:${name}`;
      const e = this.entries.get(digest);
      if (inUse.has(digest) || (e && e.refs > 0)) {
        kept.add(digest);
        continue;
      }
      const dir = path.join(this.root, name);
      clearTimeout(e?.idleTimer);
      const doIt = async (): Promise<void> => {
        if (await this.unmountDir(dir, true)) unmounted.push(digest);
        await rmdir(dir).catch(() => undefined);
        if (e?.mounted) await this.letGo(e.files);
        if (e) e.mounted = false;
      };
      if (e) await this.serialize(e, doIt).finally(() => this.forgetIfIdle(digest, e));
      else await doIt();
    }
    if (this.deps.storeDir) await this.detachStrayLoops(path.resolve(this.deps.storeDir));
    await this.deps.lazy?.reconcile(kept);
    return { unmounted };
  }

  private async detachStrayLoops(storeDir: string): Promise<void> {
    const mountedSources = new Set((await readMountInfo()).map((m) => m.source));
    for (const loop of await listLoopDevices()) {
      const backing = loop.backingFile.replace(/ \(deleted\)$/, '');
      if (!backing.startsWith(`${storeDir}/`) || mountedSources.has(loop.device)) continue;
      this.deps.logger?.warn({ device: loop.device, backing }, 'detaching stray layer loop device');
      await runTool(this.deps.losetupBinary ?? 'losetup', ['-d', loop.device]);
    }
  }

  private async serialize(e: Entry, fn: () => Promise<void>): Promise<void> {
    e.busy++;
    const p = e.chain.then(fn);
    e.chain = p.catch(() => undefined);
    try {
      await p;
    } finally {
      e.busy--;
    }
  }

  private forgetIfIdle(digest: string, e: Entry): void {
    if (e.refs === 0 && !e.mounted && e.busy === 0 && this.entries.get(digest) === e) this.entries.delete(digest);
  }

  private async mountLayer(files: LayerFiles, dir: string): Promise<void> {
    const { imagePath, blobPath } = files;
    await mkdir(dir, { recursive: true });
    if (files.lazy) {
      if (!this.deps.lazy) throw new RollboxError('internal', `layer ${files.digest} is lazy and this host reads no lazy layers`);
      // A mount whose blob went unguarded meanwhile may have read holes as zeros: never adopted.
      if (isMountPoint(dir) && !(await this.deps.lazy.canAdopt(files.digest))) throw new RollboxError('internal', `lazy layer ${files.digest} was mounted while its gate was lost: not adopted`);
      // Before the mount opens the blob: the mount's reads of missing chunks then wait for them.
      await this.deps.lazy.attach(files);
    }
    if (isMountPoint(dir)) {
      // Left by a previous worker process: adopt it if it is this layer, else replace it.
      const real = await realpath(imagePath).catch(() => imagePath);
      if (blobPath) {
        const m = (await readMountInfo()).find((i) => i.mountPoint === dir);
        if (m?.fsType === 'erofs' && m.source === real) return;
      } else {
        const loop = await loopDeviceOf(dir);
        if (loop && loop.backingFile === real) return;
      }
      await this.unmountDir(dir, true);
    }
    const r = blobPath
      ? await runTool(this.deps.gateBinary ?? DEFAULT_GATE_BINARY, ['mount', imagePath, dir, blobPath])
      : await runTool(this.deps.mountBinary ?? 'mount', ['-t', 'erofs', '-o', 'ro,loop,nodev,nosuid', imagePath, dir]);
    if (r.code !== 0) {
      if (files.lazy) await this.deps.lazy?.detach(files.digest).catch(() => undefined);
      throw new RollboxError('internal', `mounting layer ${imagePath} failed: ${r.stderr.trim()}`);
    }
  }

  /** Unmount whatever is at `dir` and make sure its loop device is detached. Returns whether it was mounted. */
  private async unmountDir(dir: string, lazyFallback: boolean): Promise<boolean> {
    if (!isMountPoint(dir)) return false;
    const loop = await loopDeviceOf(dir);
    const outcome = await unmount(dir, {
      umountBinary: this.deps.umountBinary,
      lazyFallback,
      onLazy: (stderr) => this.deps.logger?.warn({ dir, stderr }, 'layer busy; detaching lazily'),
    });
    // Lazily detached: autoclear frees the loop device once the last user is gone.
    if (outcome === 'unmounted' && loop) await this.detachLoop(loop.device, loop.backingFile);
    return true;
  }

  /**
   * `mount -o loop` sets autoclear, so the device normally frees itself on unmount; wait
   * briefly for that and detach explicitly if it did not (only if it still backs the same file).
   */
  private async detachLoop(device: string, backingFile: string): Promise<void> {
    const name = path.basename(device);
    for (let i = 0; i < 20; i++) {
      const current = await loopBackingFile(name);
      if (current !== backingFile) return;
      if (i >= 4) await runTool(this.deps.losetupBinary ?? 'losetup', ['-d', device]);
      await sleep(5);
    }
    this.deps.logger?.warn({ device, backingFile }, 'loop device still attached after unmount');
  }
}
