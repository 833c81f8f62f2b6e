import { readFile } from 'node:fs/promises';
import { RollboxError } from '../../api/index.ts';
import { runTool } from '../../proc/index.ts';

/**
 * Changes inside a running sandbox's mount namespace, made from the host (the agent has no
 * mount rights): hide a path (an empty read-only tmpfs over a directory, /dev/null over a
 * file), reveal one rollbox hid (unmount), write a file (resolv.conf, hosts).
 *
 * Why perl and not `nsenter -m mount ...`: after entering the sandbox's mount namespace,
 * nsenter would exec `mount` from the sandbox's own filesystem, a binary the agent
 * controls, as host root. perl (perl-base is Essential on Debian) is loaded from the host
 * first, then calls setns(2) and mount(2) itself; nothing is executed after the switch.
 * Paths are resolved inside the sandbox, and a final symlink is never followed.
 */
const SCRIPT = String.raw`
use strict;
use warnings;
use Fcntl qw(O_RDONLY O_WRONLY O_CREAT O_NOFOLLOW O_NONBLOCK O_NOCTTY);
my ($SYS_setns, $SYS_mount, $SYS_umount2, $pid, @ops) = @ARGV;
my ($MS_RDONLY, $MS_NOSUID, $MS_NODEV, $MS_NOEXEC, $MS_REMOUNT, $MS_BIND) = (1, 2, 4, 8, 32, 4096);
my $UMOUNT_NOFOLLOW = 8;
# The contents of the write ops, in their order, NUL-separated (text files hold no NUL).
my @contents = split /\0/, (do { local $/; <STDIN> } // ''), -1;
sysopen(my $ns, "/proc/$pid/ns/mnt", O_RDONLY) or die "open mount namespace of $pid: $!\n";
syscall($SYS_setns, fileno($ns), 0x00020000) == 0 or die "setns: $!\n";
chdir('/') or die "chdir: $!\n";
# Refuse before changing anything: a stage change applies whole or not at all (as far as
# the kernel lets us: a mount that fails past this check leaves the earlier ones done).
for (my $i = 0; $i < @ops; $i += 2) {
  die "$ops[$i + 1] is a symbolic link; hide its target instead\n" if $ops[$i] eq 'hide' && -l $ops[$i + 1];
}
while (@ops) {
  my ($op, $path) = splice(@ops, 0, 2);
  if ($op eq 'hide') {
    my @st = lstat($path);
    if (!@st) { next if $!{ENOENT}; die "lstat $path: $!\n" }
    die "$path is a symbolic link; hide its target instead\n" if -l _;
    # perl's syscall wants writable strings: copies, not literals.
    my ($source, $fstype, $data, $null) = ('rollbox-hidden', 'tmpfs', 'size=4k,mode=000', '/dev/null');
    if (-d _) {
      syscall($SYS_mount, $source, $path, $fstype, $MS_RDONLY | $MS_NOSUID | $MS_NODEV | $MS_NOEXEC, $data) == 0 or die "hide $path: $!\n";
    } else {
      syscall($SYS_mount, $null, $path, 0, $MS_BIND, 0) == 0 or die "hide $path: $!\n";
      syscall($SYS_mount, 0, $path, 0, $MS_BIND | $MS_REMOUNT | $MS_RDONLY, 0) == 0 or die "hide $path (read-only): $!\n";
    }
  } elsif ($op eq 'reveal') {
    syscall($SYS_umount2, $path, $UMOUNT_NOFOLLOW) == 0 or die "reveal $path: $!\n";
  } elsif ($op eq 'write') {
    # Only into a regular file: the agent may have put a device node or a FIFO there
    # (CAP_MKNOD), and this process is host root outside the sandbox's device cgroup.
    sysopen(my $f, $path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0644) or die "open $path: $!\n";
    die "$path is not a regular file\n" unless -f $f;
    truncate($f, 0) or die "truncate $path: $!\n";
    my $content = shift(@contents) // '';
    defined syswrite($f, $content) or die "write $path: $!\n";
    close($f);
  } else {
    die "unknown op $op\n";
  }
}
`;

const SYSCALLS: Partial<Record<NodeJS.Architecture, { setns: number; mount: number; umount2: number }>> = {
  x64: { setns: 308, mount: 165, umount2: 166 },
  arm64: { setns: 268, mount: 40, umount2: 39 },
};

export type MountNsOp = { op: 'hide' | 'reveal'; path: string } | { op: 'write'; path: string; content: string };

/** Runs `ops` in order inside the mount namespace of process `pid`, in one process. */
export async function inMountNamespace(pid: number, ops: readonly MountNsOp[], perlBinary = 'perl'): Promise<void> {
  if (ops.length === 0) return;
  const nr = SYSCALLS[process.arch];
  if (!nr) throw new RollboxError('internal', `mount namespace changes are not supported on ${process.arch}`);
  const args = ['-e', SCRIPT, String(nr.setns), String(nr.mount), String(nr.umount2), String(pid), ...ops.flatMap((o) => [o.op, o.path])];
  const input = ops.flatMap((o) => (o.op === 'write' ? [o.content] : [])).join('\0');
  const r = await runTool(perlBinary, args, { input });
  const stderr = r.code === 0 ? '' : r.stderr.trim() || `exit ${r.code}`;
  if (stderr) throw new RollboxError('invalid_request', stderr.slice(0, 500));
}

/** Mount points of the namespace of `pid`, as its processes see them (mountinfo field 5, unescaped). */
export async function mountPointsOf(pid: number): Promise<Set<string>> {
  const text = await readFile(`/proc/${pid}/mountinfo`, 'utf8');
  const unescape = (s: string) => s.replace(/\\([0-7]{3})/g, (_m, oct: string) => String.fromCharCode(parseInt(oct, 8)));
  return new Set(text.split('\n').filter(Boolean).map((line) => unescape(line.split(' ')[4] ?? '')));
}
