import { spawn, type ChildProcess } from 'node:child_process';
import { constants as osConstants } from 'node:os';
import type { Socket } from 'node:net';
import { RollboxError } from '../../api/index.ts';

/**
 * Why a helper process at all: a sandbox disk needs a loop device attached with autoclear
 * (LOOP_CONFIGURE), a mount(2), later a umount2(2), a copy of a sparse template (SEEK_DATA)
 * and fallocate. Node has none of these without a native addon, and spawning
 * losetup/mount costs 8-10 ms each on these hosts (fork of a large process in a VM), which
 * would add 20-30% to a create whose `runc run` takes ~70 ms. So one long-lived perl
 * process (perl-base is Essential on Debian) does the syscalls for us, at ~0.1 ms per
 * request. It reads one request per line on stdin and exits at EOF, i.e. with the worker;
 * a loop device it holds between attach and mount then auto-detaches.
 *
 * Protocol: `<seq>\t<op>\t<arg>...\n` in, `<seq>\tok\t<result>\n` or
 * `<seq>\terr\t<errno>\t<message>\n` out. Arguments are data, never code.
 */
const HELPER_SCRIPT = String.raw`
use strict;
use warnings;
use Fcntl qw(O_RDONLY O_RDWR O_CREAT O_EXCL);
use Errno qw(ENXIO EBUSY);

my ($SYS_mount, $SYS_umount2, $SYS_fallocate, $SYS_syncfs) = map { int } @ARGV;
my ($LOOP_CTL_GET_FREE, $LOOP_CONFIGURE) = (0x4C82, 0x4C0A);
my ($LO_FLAGS_AUTOCLEAR, $LO_FLAGS_DIRECT_IO) = (4, 16);
my ($SEEK_SET, $SEEK_DATA, $SEEK_HOLE) = (0, 3, 4);
my $FICLONE = 0x40049409;
$| = 1;

sub fail { my $what = shift; die sprintf("%d\t%s: %s\n", $! + 0, $what, $!) }

# Attach file (an open handle) to a free loop device with autoclear (it detaches itself
# when its last user, normally the mount, goes) and optionally direct I/O (no second copy
# of the data in the page cache). Returns the device's name and an open handle on it.
sub attach {
  my ($file, $name, $direct_io) = @_;
  sysopen(my $ctl, '/dev/loop-control', O_RDWR) or fail('open /dev/loop-control');
  for my $attempt (1 .. 64) {
    my $n = ioctl($ctl, $LOOP_CTL_GET_FREE, 0);
    defined $n or fail('LOOP_CTL_GET_FREE');
    my $dev = '/dev/loop' . ($n + 0);
    sysopen(my $loop, $dev, O_RDWR) or fail("open $dev");
    my $flags = $LO_FLAGS_AUTOCLEAR | ($direct_io ? $LO_FLAGS_DIRECT_IO : 0);
    my $info = pack('Q5 L4 a64 a64 a32 Q2', 0, 0, 0, 0, 0, 0, 0, 0, $flags, substr($name, 0, 63), '', '', 0, 0);
    my $config = pack('L L', fileno($file), 0) . $info . ("\0" x 64);
    return ($dev, $loop) if ioctl($loop, $LOOP_CONFIGURE, $config);
    fail("LOOP_CONFIGURE $dev") unless $! == EBUSY;
    # Another process took this device between GET_FREE and CONFIGURE: ask again.
    close($loop);
  }
  die "16\tno free loop device\n";
}

# Mount dev on target; the caller's handle on dev is closed either way, so after a failed
# mount the device detaches itself.
sub mount_dev {
  my ($dev, $loop, $target, $fstype, $flags, $data) = @_;
  if (syscall($SYS_mount, $dev, $target, $fstype, $flags + 0, $data) != 0) {
    my $e = $!;
    close($loop);
    $! = $e;
    fail("mount $dev on $target");
  }
  close($loop);
  return $dev;
}

sub mount_image {
  my ($image, $target, $fstype, $flags, $data, $direct_io) = @_;
  sysopen(my $file, $image, O_RDWR) or fail("open $image");
  my ($dev, $loop) = attach($file, $image, $direct_io);
  close($file);
  return mount_dev($dev, $loop, $target, $fstype, $flags, $data);
}

# A new disk from a formatted template: create image (fully reserved with fallocate if
# preallocate, else sparse) of the template's size, attach it, write the template's data
# ranges (~150 KB per GiB) through the loop device, and mount it. Through the device, the
# data lands in the page cache the mount reads from; the image file gets it on writeback.
sub make_disk {
  my ($template, $image, $preallocate, $target, $fstype, $flags, $data) = @_;
  sysopen(my $in, $template, O_RDONLY) or fail("open $template");
  my $size = (stat($in))[7];
  sysopen(my $file, $image, O_RDWR | O_CREAT | O_EXCL, 0600) or fail("create $image");
  my $ok = eval {
    if ($preallocate) {
      syscall($SYS_fallocate, fileno($file), 0, 0, $size + 0) == 0 or fail("fallocate $image");
    } else {
      truncate($file, $size) or fail("truncate $image");
    }
    1;
  };
  my ($dev, $loop) = $ok ? eval { attach($file, $image, 1) } : ();
  if (!defined $loop) { my $err = $@; unlink($image); die $err }
  close($file);
  $ok = eval {
    my $pos = 0;
    while ($pos < $size) {
      my $start = sysseek($in, $pos, $SEEK_DATA);
      if (!defined $start) { last if $! == ENXIO; fail("seek $template") }
      my $end = sysseek($in, $start, $SEEK_HOLE);
      defined $end or fail("seek $template");
      ($start, $end) = ($start + 0, $end + 0);
      for (my $off = $start; $off < $end;) {
        my $want = $end - $off;
        $want = 1 << 20 if $want > 1 << 20;
        defined sysseek($in, $off, $SEEK_SET) or fail("seek $template");
        my $got = sysread($in, my $buf, $want);
        defined $got or fail("read $template");
        last if $got == 0;
        defined sysseek($loop, $off, $SEEK_SET) or fail("seek $dev");
        my $put = syswrite($loop, $buf);
        (defined $put && $put == $got) or fail("write $dev");
        $off += $got;
      }
      $pos = $end;
    }
    1;
  };
  if (!$ok) { my $err = $@; close($loop); unlink($image); die $err }
  return mount_dev($dev, $loop, $target, $fstype, $flags, $data);
}

# Throw an ext4 filesystem away: after EXT4_IOC_SHUTDOWN (NOLOGFLUSH) its dirty pages are
# dropped instead of written, so unmounting a disk full of fresh writes is instant.
sub shutdown_fs {
  my ($dir) = @_;
  sysopen(my $fd, $dir, O_RDONLY) or fail("open $dir");
  my $how = pack('L', 2);
  ioctl($fd, 0x8004587D, $how) or fail("EXT4_IOC_SHUTDOWN $dir");
  close($fd);
  return '';
}

# Mount an attached loop device again (its filesystem is live in a sandbox's overlay): only
# if it is still bound to image, checked while our handle on it keeps it from detaching and
# being reused by another disk meanwhile.
sub mount_loop {
  my ($dev, $image, $target, $fstype, $flags, $data) = @_;
  my ($name) = $dev =~ m{^/dev/(loop\d+)$} or do { $! = 22; fail("not a loop device: $dev") };
  sysopen(my $loop, $dev, O_RDONLY) or fail("open $dev");
  my $bound = '';
  if (open(my $bf, '<', "/sys/block/$name/loop/backing_file")) { $bound = <$bf> // ''; close($bf) }
  chomp $bound;
  if ($bound ne $image) { close($loop); $! = 6; fail("$dev is no longer bound to $image") }
  return mount_dev($dev, $loop, $target, $fstype, $flags, $data);
}

# A copy of a sandbox disk that costs no data, taken while every process that could write
# to it is frozen (the caller's cgroup freeze): the filesystem mounted at dir is synced
# (syncfs: its dirty data, inodes and metadata written to the image), then the image is
# cloned (FICLONE: the scratch filesystem shares the blocks, copy-on-write). Not FIFREEZE:
# it takes three RCU grace periods (~40 ms here) to hold writers the freezer holds already.
sub clone_synced {
  my ($dir, $src, $dst) = @_;
  sysopen(my $fs, $dir, O_RDONLY) or fail("open $dir");
  # The sandbox's disk, not the host filesystem under it (a disk unmounted meanwhile leaves
  # a plain dir there): the handle, held from here on, is on another filesystem than the dir's parent.
  if ((stat($fs))[0] == (stat("$dir/.."))[0]) { $! = 22; fail("$dir is not a mount point") }
  sysopen(my $in, $src, O_RDONLY) or fail("open $src");
  sysopen(my $out, $dst, O_RDWR | O_CREAT | O_EXCL, 0600) or fail("create $dst");
  if (syscall($SYS_syncfs, fileno($fs)) != 0) { my $e = $!; unlink($dst); $! = $e; fail("syncfs $dir") }
  if (!ioctl($out, $FICLONE, fileno($in) + 0)) { my $e = $!; unlink($dst); $! = $e; fail("FICLONE $src") }
  return '';
}

# A new disk that starts as a clone of seed (a frozen copy of another sandbox's disk):
# cloned, attached (autoclear, direct I/O) and mounted as make_disk does.
sub clone_disk {
  my ($seed, $image, $target, $fstype, $flags, $data) = @_;
  sysopen(my $in, $seed, O_RDONLY) or fail("open $seed");
  sysopen(my $file, $image, O_RDWR | O_CREAT | O_EXCL, 0600) or fail("create $image");
  if (!ioctl($file, $FICLONE, fileno($in) + 0)) { my $e = $!; unlink($image); $! = $e; fail("FICLONE $seed") }
  my ($dev, $loop) = eval { attach($file, $image, 1) };
  if (!defined $loop) { my $err = $@; unlink($image); die $err }
  close($file);
  my $dev_mounted = eval { mount_dev($dev, $loop, $target, $fstype, $flags, $data) };
  if (!defined $dev_mounted) { my $err = $@; unlink($image); die $err }
  return $dev_mounted;
}

sub umount_target {
  my ($target, $flags) = @_;
  syscall($SYS_umount2, $target, $flags + 0) == 0 or fail("umount $target");
  return '';
}

while (defined(my $line = <STDIN>)) {
  chomp $line;
  my ($seq, $op, @args) = split /\t/, $line, -1;
  my $result = eval {
    if ($op eq 'make-disk') { make_disk(@args) }
    elsif ($op eq 'mount-image') { mount_image(@args) }
    elsif ($op eq 'mount-loop') { mount_loop(@args) }
    elsif ($op eq 'umount') { umount_target(@args) }
    elsif ($op eq 'shutdown') { shutdown_fs(@args) }
    elsif ($op eq 'clone-synced') { clone_synced(@args) }
    elsif ($op eq 'clone-disk') { clone_disk(@args) }
    else { die "22\tunknown op $op\n" }
  };
  if (defined $result) {
    print "$seq\tok\t$result\n";
  } else {
    my $err = $@ || "0\tunknown error\n";
    $err =~ s/\n+$//;
    $err =~ tr/\n/ /;
    print "$seq\terr\t$err\n";
  }
}
`;

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

/** Client of the helper process; started on first use, restarted if it dies. */
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
