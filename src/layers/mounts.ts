import { mkdir, readdir, realpath, rmdir } from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { RollboxError } from '../api/index.ts';
import { hexOfDigest } from './digest.ts';
import { isMountPoint, listLoopDevices, loopBackingFile, loopDeviceOf, readMountInfo, unmount } from './hostmounts.ts';
import { runTool } from '../proc/index.ts';

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
  imagePath: string;
  /** Set while an unused layer lingers mounted (idleUnmountDelayMs). */
  idleTimer?: NodeJS.Timeout;
}

/**
 * Reference-counted, read-only mounts of layer images, shared by every sandbox on the
 * host: each image is loop-mounted once at `<dataDir>/mnt/layers/<hex>` and unmounted
 * (loop device detached) when its last user releases it (or `idleUnmountDelayMs` later). Mount and unmount of one digest
 * are serialized, so concurrent acquires mount once and a release racing an acquire never
 * unmounts a layer someone holds.
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

  /** Take a reference on a layer, mounting it if this is the first; returns its mount directory. */
  async acquire(digest: string, imagePath: string): Promise<string> {
    const dir = this.dirOf(digest);
    let e = this.entries.get(digest);
    if (!e) {
      e = { refs: 0, mounted: false, busy: 0, chain: Promise.resolve(), imagePath };
      this.entries.set(digest, e);
    }
    e.refs++;
    clearTimeout(e.idleTimer);
    if (e.mounted && e.busy === 0) return dir; // hot path: a refcount bump
    const entry = e;
    try {
      await this.serialize(entry, async () => {
        if (!entry.mounted) {
          await this.mountImage(imagePath, dir);
          entry.imagePath = imagePath;
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
        }
      });
    } catch (err) {
      this.deps.logger?.warn({ digest, err: String(err) }, 'layer still mounted');
    } finally {
      this.forgetIfIdle(digest, e);
    }
  }

  /**
   * Unmount and detach every layer mount under this instance's directory whose digest is
   * neither in `inUse` nor currently referenced, then detach loop devices left bound to
   * images of the store without any mount (a crash between attach and mount).
   */
  async reconcile(inUse: ReadonlySet<string>): Promise<{ unmounted: string[] }> {
    const unmounted: string[] = [];
    const names = await readdir(this.root).catch(() => [] as string[]);
    for (const name of names) {
      if (!/^[0-9a-f]{64}$/.test(name)) continue;
      const digest = `sha256:${name}`;
      const e = this.entries.get(digest);
      if (inUse.has(digest) || (e && e.refs > 0)) continue;
      const dir = path.join(this.root, name);
      clearTimeout(e?.idleTimer);
      const doIt = async (): Promise<void> => {
        if (await this.unmountDir(dir, true)) unmounted.push(digest);
        await rmdir(dir).catch(() => undefined);
        if (e) e.mounted = false;
      };
      if (e) await this.serialize(e, doIt).finally(() => this.forgetIfIdle(digest, e));
      else await doIt();
    }
    if (this.deps.storeDir) await this.detachStrayLoops(path.resolve(this.deps.storeDir));
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

  private async mountImage(imagePath: string, dir: string): Promise<void> {
    await mkdir(dir, { recursive: true });
    if (isMountPoint(dir)) {
      // Left by a previous worker process: adopt it if it is this image, else replace it.
      const loop = await loopDeviceOf(dir);
      if (loop && loop.backingFile === (await realpath(imagePath).catch(() => imagePath))) return;
      await this.unmountDir(dir, true);
    }
    const r = await runTool(this.deps.mountBinary ?? 'mount', ['-t', 'erofs', '-o', 'ro,loop,nodev,nosuid', imagePath, dir]);
    if (r.code !== 0) throw new RollboxError('internal', `mounting layer ${imagePath} failed: ${r.stderr.trim()}`);
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
