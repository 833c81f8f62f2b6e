/**
 * The disk helper's program (see diskhelper.ts): one long-lived perl process doing the
 * syscalls of sandbox disks. Protocol: `<seq>\t<op>\t<arg>...\n` in, `<seq>\tok\t<result>\n`
 * or `<seq>\terr\t<errno>\t<message>\n` out. Arguments are data, never code. Its argv: the
 * syscall numbers of mount, umount2, fallocate and syncfs.
 */
export const HELPER_SCRIPT = String.raw`
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
