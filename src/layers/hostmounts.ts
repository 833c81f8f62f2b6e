import { statSync } from 'node:fs';
import { readFile, readdir, readlink, stat } from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { RollboxError } from '../api/index.ts';
import { runTool } from '../proc/index.ts';

export interface MountInfo {
  mountPoint: string;
  fsType: string;
  source: string;
  /** Root of the mount within its filesystem (bind mounts, cgroup namespaces). */
  root: string;
  superOptions: string;
}

function unescapeMountField(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_m, oct: string) => String.fromCharCode(parseInt(oct, 8)));
}

/** Parse /proc/self/mountinfo (the mounts of the worker's mount namespace). */
export async function readMountInfo(): Promise<MountInfo[]> {
  const text = await readFile('/proc/self/mountinfo', 'utf8');
  const out: MountInfo[] = [];
  for (const line of text.split('\n')) {
    if (!line) continue;
    const fields = line.split(' ');
    const sep = fields.indexOf('-', 6);
    if (sep < 0 || fields.length < sep + 3) continue;
    out.push({
      mountPoint: unescapeMountField(fields[4]!),
      root: unescapeMountField(fields[3]!),
      fsType: fields[sep + 1]!,
      source: unescapeMountField(fields[sep + 2]!),
      superOptions: fields[sep + 3] ?? '',
    });
  }
  return out;
}

/** Whether something is mounted at `dir`: a mount point's st_dev differs from its parent's. Two stats of local paths, synchronous: ~10 µs, where a thread-pool round trip costs more. */
export function isMountPoint(dir: string): boolean {
  try {
    const [a, b] = [statSync(dir), statSync(path.dirname(dir))];
    return a.dev !== b.dev || a.ino === b.ino;
  } catch {
    return false;
  }
}

/** Linux dev_t (new encoding) to major/minor. */
export function devMajorMinor(dev: number): { major: number; minor: number } {
  return { major: Math.floor(dev / 256) & 0xfff, minor: (dev & 0xff) | (Math.floor(dev / 4096) & 0xfff00) };
}

export interface LoopDevice {
  device: string; // /dev/loopN
  backingFile: string;
}

/** The loop device a mount point is backed by, if any. */
export async function loopDeviceOf(dir: string): Promise<LoopDevice | undefined> {
  try {
    const { major, minor } = devMajorMinor((await stat(dir)).dev);
    const sys = `/sys/dev/block/${major}:${minor}`;
    const backingFile = (await readFile(`${sys}/loop/backing_file`, 'utf8')).trim();
    const name = path.basename(await readlink(sys));
    return { device: `/dev/${name}`, backingFile };
  } catch {
    return undefined;
  }
}

/** Backing file of a loop device by name (`loop3`), or undefined when it is not bound. */
export async function loopBackingFile(name: string): Promise<string | undefined> {
  try {
    return (await readFile(`/sys/block/${name}/loop/backing_file`, 'utf8')).trim();
  } catch {
    return undefined;
  }
}

/** Every bound loop device on the host. */
export async function listLoopDevices(): Promise<LoopDevice[]> {
  const names = (await readdir('/sys/block').catch(() => [] as string[])).filter((n) => /^loop\d+$/.test(n));
  // Read side by side: a host keeps hundreds of (mostly unbound) loop devices, and a worker
  // lists them at every start, stop and scratch teardown.
  const backingFiles = await Promise.all(names.map(loopBackingFile));
  return names.flatMap((n, i) => (backingFiles[i] ? [{ device: `/dev/${n}`, backingFile: backingFiles[i] }] : []));
}

export interface UnmountOptions {
  umountBinary?: string;
  /** When it stays busy: detach it lazily (`umount -l`) instead of failing. */
  lazyFallback: boolean;
  /** Told when it falls back to a lazy detach (operators want to know). */
  onLazy?: (stderr: string) => void;
}

/**
 * Unmount `dir` on the host: `'not-mounted'`, `'unmounted'`, or `'detached'` (lazily; the
 * kernel finishes once the last user is gone). Throws if it stays mounted. A sandbox's
 * mounts are released with its container's mount namespace, which the kernel may finish
 * tearing down just after the last process is reaped: EBUSY is retried briefly (5 ms
 * doubling to 640 ms, about 1.3 s in all) before the lazy fallback.
 */
export async function unmount(dir: string, opts: UnmountOptions): Promise<'not-mounted' | 'unmounted' | 'detached'> {
  if (!isMountPoint(dir)) return 'not-mounted';
  const umount = opts.umountBinary ?? 'umount';
  let r = await runTool(umount, [dir]);
  for (let delayMs = 5; r.code !== 0 && delayMs <= 640 && isMountPoint(dir); delayMs *= 2) {
    await sleep(delayMs);
    r = await runTool(umount, [dir]);
  }
  if (r.code === 0 || !isMountPoint(dir)) return 'unmounted';
  if (opts.lazyFallback) {
    opts.onLazy?.(r.stderr.trim());
    r = await runTool(umount, ['-l', dir]);
    if (r.code === 0 || !isMountPoint(dir)) return 'detached';
  }
  throw new RollboxError('internal', `unmounting ${dir} failed: ${r.stderr.trim()}`);
}

/** Loop devices matching `match` still there after waiting (backing off to `maxDelayMs`) for them to detach themselves. */
export async function loopsLeft(match: (l: LoopDevice) => boolean, maxDelayMs: number): Promise<string[]> {
  for (let delayMs = 2; ; delayMs *= 2) {
    const left = (await listLoopDevices()).filter(match).map((l) => l.device);
    if (left.length === 0 || delayMs > maxDelayMs) return left;
    await sleep(delayMs);
  }
}
