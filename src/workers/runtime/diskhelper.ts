import { spawn, type ChildProcess } from 'node:child_process';
import { constants as osConstants } from 'node:os';
import type { Socket } from 'node:net';
import { RollboxError } from '../../api/index.ts';
import { HELPER_SCRIPT } from './diskhelper-script.ts';

/** Linux syscall numbers the helper needs (perl's `syscall` takes raw numbers). */
const SYSCALLS: Partial<Record<NodeJS.Architecture, { mount: number; umount2: number; fallocate: number; syncfs: number }>> = {
  x64: { mount: 165, umount2: 166, fallocate: 285, syncfs: 306 },
  arm64: { mount: 40, umount2: 39, fallocate: 47, syncfs: 267 },
};

export const MS_RDONLY = 0x1;
export const MS_NOSUID = 0x2;
export const MS_NODEV = 0x4;
export const MS_NOEXEC = 0x8;
export const MNT_DETACH = 0x2;

const ERRNO_NAMES = new Map<number, string>(Object.entries(osConstants.errno).map(([name, n]) => [n, name]));

/** A failed helper operation; `errno` is the symbolic name (`ENOSPC`, `EBUSY`, ...). */
export class DiskOpError extends RollboxError {
  constructor(
    readonly errno: string,
    message: string,
  ) {
    super('internal', message);
  }
}

interface Pending {
  resolve(value: string): void;
  reject(err: Error): void;
}

export interface DiskHelperOptions {
  /** Default `perl`. */
  perlBinary?: string;
}

/**
 * Why a helper process at all: a sandbox disk needs a loop device attached with autoclear
 * (LOOP_CONFIGURE), a mount(2), later a umount2(2), a copy of a sparse template (SEEK_DATA)
 * and fallocate. Node has none of these without a native addon, and spawning
 * losetup/mount costs 8-10 ms each on these hosts (fork of a large process in a VM), which
 * would add 20-30% to a create whose `runc run` takes ~70 ms. So one long-lived perl
 * process (perl-base is Essential on Debian) does the syscalls for us, at ~0.1 ms per
 * request. It reads one request per line on stdin and exits at EOF, i.e. with the worker;
 * a loop device it holds between attach and mount then auto-detaches.
 * The program and its protocol: diskhelper-script.ts. This is its client: the process
 * is started on first use and restarted if it dies.
 */
export class DiskHelper {
  private child: ChildProcess | undefined;
  private readonly pending = new Map<number, Pending>();
  private seq = 0;
  private buffered = '';
  private stderrTail = '';

  constructor(private readonly opts: DiskHelperOptions = {}) {}

  /**
   * Create `image` as a copy of the formatted `template` (its blocks all reserved if
   * `preallocate`, else sparse), loop-attach it (autoclear, direct I/O) and mount it on
   * `target`. Returns the loop device. On failure nothing is left (no file, no device).
   */
  makeDisk(template: string, image: string, preallocate: boolean, target: string, fsType: string, flags: number, data: string): Promise<string> {
    return this.request('make-disk', [template, image, preallocate ? '1' : '0', target, fsType, String(flags), data]);
  }

  /** Loop-attach `image` (autoclear, direct I/O if asked) and mount it on `target`. Returns the loop device. */
  mountImage(image: string, target: string, fsType: string, flags: number, data: string, directIo: boolean): Promise<string> {
    return this.request('mount-image', [image, target, fsType, String(flags), data, directIo ? '1' : '0']);
  }

  /**
   * Mount loop device `device` on `target` again, only while it is still bound to `image`
   * (else ENXIO): a disk whose filesystem lives on in a sandbox's overlay.
   */
  async mountLoop(device: string, image: string, target: string, fsType: string, flags: number, data: string): Promise<void> {
    await this.request('mount-loop', [device, image, target, fsType, String(flags), data]);
  }

  async umount(target: string, flags = 0): Promise<void> {
    await this.request('umount', [target, String(flags)]);
  }

  /** Shut an ext4 filesystem down: its unwritten data is dropped, never written (see the script). */
  async shutdown(mountPoint: string): Promise<void> {
    await this.request('shutdown', [mountPoint]);
  }

  /**
   * `dst` as a copy-on-write clone of the disk image `src` whose filesystem is mounted at
   * `mountPoint`, synced first; the caller keeps every writer of it frozen meanwhile. Fails
   * with EOPNOTSUPP (or EXDEV, EINVAL) where the scratch filesystem cannot clone; nothing is left then.
   */
  async cloneSynced(mountPoint: string, src: string, dst: string): Promise<void> {
    await this.request('clone-synced', [mountPoint, src, dst]);
  }

  /** Like makeDisk, with the new disk a copy-on-write clone of `seed` instead of a template. */
  cloneDisk(seed: string, image: string, target: string, fsType: string, flags: number, data: string): Promise<string> {
    return this.request('clone-disk', [seed, image, target, fsType, String(flags), data]);
  }

  /** Let the helper exit (it is started again on the next request). */
  close(): void {
    this.child?.stdin?.end();
    this.child = undefined;
  }

  private start(): ChildProcess {
    const nr = SYSCALLS[process.arch];
    if (!nr) throw new RollboxError('internal', `sandbox disks are not supported on ${process.arch}`);
    const child = spawn(this.opts.perlBinary ?? 'perl', ['-e', HELPER_SCRIPT, String(nr.mount), String(nr.umount2), String(nr.fallocate), String(nr.syncfs)], {
      stdio: ['pipe', 'pipe', 'pipe'],
      // Not in the terminal's process group: Ctrl-C must reach the worker, which then
      // tears sandboxes down through this helper.
      detached: true,
    });
    this.buffered = '';
    this.stderrTail = '';
    child.stdout!.setEncoding('utf8');
    child.stdout!.on('data', (chunk: string) => this.onData(chunk));
    child.stderr!.on('data', (b: Buffer) => {
      this.stderrTail = (this.stderrTail + b.toString('utf8')).slice(-2000);
    });
    child.stdin!.on('error', () => undefined); // surfaces as 'exit' below
    const gone = (why: string): void => {
      if (this.child === child) this.child = undefined;
      const err = new RollboxError('internal', `disk helper ${why}${this.stderrTail ? `: ${this.stderrTail.trim()}` : ''}`);
      for (const p of this.pending.values()) p.reject(err);
      this.pending.clear();
    };
    child.on('error', (e) => gone(`failed: ${e.message}`));
    child.on('exit', (code, signal) => gone(`exited (${signal ?? code})`));
    this.child = child;
    this.setRef(false);
    return child;
  }

  /** The helper must not keep the worker alive when idle, but must while a request is out. */
  private setRef(on: boolean): void {
    const c = this.child;
    if (!c) return;
    for (const s of [c.stdin, c.stdout, c.stderr] as (Socket | null)[]) {
      if (on) s?.ref();
      else s?.unref();
    }
    if (on) c.ref();
    else c.unref();
  }

  private onData(chunk: string): void {
    this.buffered += chunk;
    let nl: number;
    while ((nl = this.buffered.indexOf('\n')) >= 0) {
      const line = this.buffered.slice(0, nl);
      this.buffered = this.buffered.slice(nl + 1);
      const [seqText, status, ...rest] = line.split('\t');
      const seq = Number(seqText);
      const p = this.pending.get(seq);
      if (!p) continue;
      this.pending.delete(seq);
      if (this.pending.size === 0) this.setRef(false);
      if (status === 'ok') p.resolve(rest.join('\t'));
      else {
        const errnoNr = Number(rest[0]);
        const name = ERRNO_NAMES.get(errnoNr) ?? (errnoNr ? `errno ${errnoNr}` : 'EUNKNOWN');
        p.reject(new DiskOpError(name, `${rest.slice(1).join('\t')} (${name})`));
      }
    }
  }

  private request(op: string, args: string[]): Promise<string> {
    for (const a of args) if (/[\t\n\0]/.test(a)) return Promise.reject(new RollboxError('invalid_request', `disk helper argument contains a tab, newline or NUL`));
    let child: ChildProcess;
    try {
      child = this.child ?? this.start();
    } catch (err) {
      return Promise.reject(err);
    }
    const seq = this.seq++;
    return new Promise<string>((resolve, reject) => {
      if (this.pending.size === 0) this.setRef(true);
      this.pending.set(seq, { resolve, reject });
      child.stdin!.write(`${seq}\t${op}\t${args.join('\t')}\n`);
    });
  }
}
