/*
 * rollbox-vminit: PID 1 of a rollbox microVM, from the initramfs (scripts/build-vminit.sh).
 *
 * It loads the guest kernel's modules (virtio, erofs, overlay), mounts each EROFS layer
 * (read-only virtio-blk disks with serials rbl0, rbl1, ... base first) and the sandbox's
 * writable ext4 disk (serial rbdisk), makes the overlay of them the new root, gives it a
 * fresh /dev with only harmless nodes (the virtio-serial port is not among them), forks
 * the channel multiplexer (mux.c, which keeps the port and stays in the initramfs), drops
 * the capabilities that could reach the port again (CAP_MKNOD, CAP_SYS_ADMIN, ...), and
 * execs rollbox-init in the new root with its listening socket as fd 3: the same init,
 * the same protocol as a container's.
 *
 * Kernel command line: rollbox.layers=N (how many layer disks), rollbox.blobs=, and
 * rollbox.net=ADDR/N,GW when the sandbox has a network (net.c), rollbox.pids=N (limits.c).
 * PID 1 and so every process of the sandbox is below the guest's cgroup /sandbox (limits.c:
 * the init in /sandbox/init, each command in an exec cgroup beside it), which holds the pids
 * limit and which the multiplexer freezes, init and commands alike (freeze.c).
 */
#define _GNU_SOURCE
#include "vminit.h"
#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <time.h>

/* Capability numbers and capset's ABI (linux/capability.h; musl ships no kernel headers). */
enum { CAP_CHOWN = 0, CAP_DAC_OVERRIDE = 1, CAP_FOWNER = 3, CAP_FSETID = 4, CAP_KILL = 5, CAP_SETGID = 6, CAP_SETUID = 7, CAP_SETPCAP = 8, CAP_NET_BIND_SERVICE = 10, CAP_NET_RAW = 13, CAP_SYS_CHROOT = 18, CAP_AUDIT_WRITE = 29, CAP_SETFCAP = 31 };
#define CAPABILITY_VERSION_3 0x20080522
struct cap_header { uint32_t version; int pid; };
struct cap_data { uint32_t effective, permitted, inheritable; };

/* Load order: each module after the ones it depends on. */
static const char *const MODULES[] = {"virtio_ring", "virtio", "virtio_mmio", "virtio_console", "virtio_blk", "virtio_balloon", "libcrc32c", "erofs", "overlay", "failover", "net_failover", "virtio_net"};
/* What commands keep: the container tier's set (src/workers/runtime/spec.ts) less CAP_MKNOD. */
static const int KEEP_CAPS[] = {CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FSETID, CAP_FOWNER, CAP_NET_RAW, CAP_SETGID, CAP_SETUID, CAP_SETFCAP, CAP_SETPCAP, CAP_NET_BIND_SERVICE, CAP_SYS_CHROOT, CAP_KILL, CAP_AUDIT_WRITE};

void vm_log(const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  dprintf(2, "rollbox-vminit: %s\n", line);
}

void vm_die(const char *what) {
  vm_log("%s: %s", what, strerror(errno));
  /* PID 1 exiting panics the guest kernel; with panic=-1 the VM resets and QEMU (-no-reboot) exits. */
  exit(1);
}

static void must_mount(const char *src, const char *dst, const char *type, unsigned long flags, const char *data) {
  mkdir(dst, 0755);
  if (mount(src, dst, type, flags, data) < 0) {
    vm_log("mount %s on %s (%s)", src, dst, type);
    vm_die("mount");
  }
}

static void load_modules(void) {
  for (size_t i = 0; i < sizeof MODULES / sizeof *MODULES; i++) {
    char p[128];
    snprintf(p, sizeof p, "/lib/modules/%s.ko", MODULES[i]);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) vm_die(p);
    if (syscall(SYS_finit_module, fd, "", 0) < 0 && errno != EEXIST) vm_die(p);
    close(fd);
    /* Loaded once: its file would stay in the initramfs's memory for the VM's life. */
    unlink(p);
  }
}

static int cmdline_int(const char *key, int fallback) {
  char buf[4096] = {0};
  int fd = open("/proc/cmdline", O_RDONLY);
  if (fd < 0) return fallback;
  ssize_t r = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (r <= 0) return fallback;
  for (char *t = strtok(buf, " \n"); t; t = strtok(NULL, " \n")) {
    size_t k = strlen(key);
    if (!strncmp(t, key, k) && t[k] == '=') return atoi(t + k + 1);
  }
  return fallback;
}

/* The block device whose virtio serial is `serial` (/sys/block/vdX/serial), waited for. */
static void disk_by_serial(const char *serial, char *dev, size_t devlen) {
  for (int tries = 0; tries < 500; tries++) {
    DIR *d = opendir("/sys/block");
    struct dirent *e;
    while (d && (e = readdir(d))) {
      if (strncmp(e->d_name, "vd", 2)) continue;
      char p[300], s[64] = {0};
      snprintf(p, sizeof p, "/sys/block/%s/serial", e->d_name);
      int fd = open(p, O_RDONLY);
      if (fd < 0) continue;
      ssize_t r = read(fd, s, sizeof s - 1);
      close(fd);
      while (r > 0 && (s[r - 1] == '\n' || s[r - 1] == ' ')) s[--r] = 0;
      if (r > 0 && !strcmp(s, serial)) {
        snprintf(dev, devlen, "/dev/%s", e->d_name);
        closedir(d);
        return;
      }
    }
    if (d) closedir(d);
    struct timespec t = {0, 10 * 1000 * 1000};
    nanosleep(&t, NULL);
  }
  errno = ENODEV;
  vm_die(serial);
}

/* /dev/vportNpM of the port named rollbox.0, opened. */
static int open_port(void) {
  for (int tries = 0; tries < 500; tries++) {
    DIR *d = opendir("/sys/class/virtio-ports");
    struct dirent *e;
    while (d && (e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      char p[300], name[64] = {0};
      snprintf(p, sizeof p, "/sys/class/virtio-ports/%s/name", e->d_name);
      int fd = open(p, O_RDONLY);
      if (fd < 0) continue;
      ssize_t r = read(fd, name, sizeof name - 1);
      close(fd);
      if (r > 0 && name[r - 1] == '\n') name[r - 1] = 0;
      if (strcmp(name, "rollbox.0")) continue;
      snprintf(p, sizeof p, "/dev/%s", e->d_name);
      closedir(d);
      int port = open(p, O_RDWR | O_NONBLOCK | O_CLOEXEC);
      if (port < 0) vm_die(p);
      return port;
    }
    if (d) closedir(d);
    struct timespec t = {0, 10 * 1000 * 1000};
    nanosleep(&t, NULL);
  }
  errno = ENODEV;
  vm_die("virtio-serial port rollbox.0");
}

/* rollbox.blobs=: one 0 or 1 per layer, base first: whether its data is a blob disk of its own. */
void vm_cmdline_str(const char *key, char *val, size_t len) {
  char buf[4096] = {0};
  val[0] = 0;
  int fd = open("/proc/cmdline", O_RDONLY);
  if (fd < 0) return;
  ssize_t r = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (r <= 0) return;
  for (char *t = strtok(buf, " \n"); t; t = strtok(NULL, " \n")) {
    size_t k = strlen(key);
    if (!strncmp(t, key, k) && t[k] == '=') {
      snprintf(val, len, "%s", t + k + 1);
      return;
    }
  }
}

static void mount_root(void) {
  int layers = cmdline_int("rollbox.layers", 1);
  char blobs[80];
  vm_cmdline_str("rollbox.blobs", blobs, sizeof blobs);
  if (layers < 1 || layers > 64) vm_die("rollbox.layers");
  char lower[64 * 16 + 1] = {0};
  for (int i = layers - 1; i >= 0; i--) {
    char serial[16], dev[300], dir[32];
    snprintf(serial, sizeof serial, "rbl%d", i);
    snprintf(dir, sizeof dir, "/layers/%d", i);
    mkdir("/layers", 0755);
    disk_by_serial(serial, dev, sizeof dev);
    char opts[340] = {0};
    if ((int)strlen(blobs) > i && blobs[i] == '1') {
      /* A split layer: metadata image plus its data blob, an EROFS extra device. */
      char blob[300];
      snprintf(serial, sizeof serial, "rbl%db", i);
      disk_by_serial(serial, blob, sizeof blob);
      snprintf(opts, sizeof opts, "device=%s", blob);
    }
    must_mount(dev, dir, "erofs", MS_RDONLY | MS_NODEV, opts[0] ? opts : NULL);
    strcat(lower, dir);
    if (i) strcat(lower, ":");
  }
  char dev[300], opts[64 * 16 + 128];
  disk_by_serial("rbdisk", dev, sizeof dev);
  must_mount(dev, "/disk", "ext4", MS_NODEV, NULL);
  mkdir("/disk/upper", 0755);
  mkdir("/disk/work", 0755);
  snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=/disk/upper,workdir=/disk/work", lower);
  must_mount("overlay", "/newroot", "overlay", 0, opts);
}

/* The sandbox's /dev: a tmpfs with the usual harmless nodes, no port, no console, no disk. */
static void make_dev(void) {
  must_mount("tmpfs", "/newroot/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=65536k");
  static const struct { const char *name; int major, minor; } nodes[] = {
      {"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}};
  for (size_t i = 0; i < sizeof nodes / sizeof *nodes; i++) {
    char p[64];
    snprintf(p, sizeof p, "/newroot/dev/%s", nodes[i].name);
    if (mknod(p, S_IFCHR | 0666, makedev(nodes[i].major, nodes[i].minor)) < 0) vm_die(p);
    chmod(p, 0666);
  }
  must_mount("devpts", "/newroot/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620");
  symlink("pts/ptmx", "/newroot/dev/ptmx");
  symlink("/proc/self/fd", "/newroot/dev/fd");
  symlink("/proc/self/fd/0", "/newroot/dev/stdin");
  symlink("/proc/self/fd/1", "/newroot/dev/stdout");
  symlink("/proc/self/fd/2", "/newroot/dev/stderr");
  must_mount("shm", "/newroot/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
  must_mount("proc", "/newroot/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
  /* Read-only, as runc's readonlyPaths make it in a container: root in the guest keeps the kernel's settings (user namespaces off, below). */
  if (mount("/newroot/proc/sys", "/newroot/proc/sys", NULL, MS_BIND | MS_REC, NULL) < 0 ||
      mount(NULL, "/newroot/proc/sys", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
    vm_die("read-only /proc/sys");
  must_mount("sysfs", "/newroot/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
}

/*
 * No user namespaces in the guest, as the container tier's seccomp profile refuses them:
 * they hand a process a full capability set (over its own namespaces) and open much of
 * the kernel to it.
 */
static void no_user_namespaces(void) {
  int fd = open("/proc/sys/user/max_user_namespaces", O_WRONLY | O_CLOEXEC);
  if (fd < 0 || write(fd, "0\n", 2) != 2) vm_die("user.max_user_namespaces");
  close(fd);
}

/* rollbox-init and busybox from the initramfs, read-only at /.rollbox (as in a container). */
static void bind_tools(void) {
  mkdir("/newroot/.rollbox", 0755);
  must_mount("tmpfs", "/newroot/.rollbox", "tmpfs", MS_NODEV, "mode=755,size=16m");
  static const char *const tools[] = {"init", "busybox"};
  for (size_t i = 0; i < 2; i++) {
    char src[64], dst[64];
    snprintf(src, sizeof src, "/rollbox/%s", tools[i]);
    snprintf(dst, sizeof dst, "/newroot/.rollbox/%s", tools[i]);
    int fd = open(dst, O_WRONLY | O_CREAT | O_CLOEXEC, 0755);
    if (fd < 0) vm_die(dst);
    close(fd);
    if (mount(src, dst, NULL, MS_BIND, NULL) < 0) vm_die(dst);
  }
  if (mount(NULL, "/newroot/.rollbox", NULL, MS_REMOUNT | MS_RDONLY | MS_BIND, NULL) < 0) vm_die("remount /.rollbox");
}

static void drop_capabilities(void) {
  uint64_t keep = 0;
  for (size_t i = 0; i < sizeof KEEP_CAPS / sizeof *KEEP_CAPS; i++) keep |= 1ull << KEEP_CAPS[i];
  for (int c = 0; c <= 63; c++) {
    if (keep & (1ull << c)) continue;
    if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL) vm_die("PR_CAPBSET_DROP");
  }
  struct cap_header h = {CAPABILITY_VERSION_3, 0};
  struct cap_data d[2] = {{(uint32_t)keep, (uint32_t)keep, 0}, {(uint32_t)(keep >> 32), (uint32_t)(keep >> 32), 0}};
  if (syscall(SYS_capset, &h, d) < 0) vm_die("capset");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) vm_die("PR_SET_NO_NEW_PRIVS");
}

int main(void) {
  must_mount("proc", "/proc", "proc", 0, NULL);
  must_mount("sysfs", "/sys", "sysfs", 0, NULL);
  must_mount("devtmpfs", "/dev", "devtmpfs", 0, NULL);
  load_modules();
  vm_report_order_setup();
  mount_root();
  make_dev();
  bind_tools();
  vm_net_setup();
  no_user_namespaces();
  int port = open_port();
  /* The sandbox's root, for the multiplexer's hidden paths (hide.c): the overlay, wherever it is mounted next. */
  int root = open("/newroot", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) vm_die("open /newroot");
  mkdir("/run", 0700);
  int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  strcpy(a.sun_path, INIT_SOCKET_PATH);
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) < 0 || listen(lfd, 128) < 0) vm_die("init socket");
  pid_t mux = fork();
  if (mux < 0) vm_die("fork");
  if (mux == 0) {
    close(lfd);
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) vm_die("PR_SET_DUMPABLE");
    /* The guest's OOM killer never takes the channel: the sandbox's commands are what it kills. */
    int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (adj < 0 || write(adj, "-1000", 5) != 5) vm_die("oom_score_adj");
    close(adj);
    mux_main(port, root);
  }
  close(port);
  close(root);
  /* After the fork: the multiplexer stays outside the sandbox's cgroups, its pids limit and its freezer. */
  int cgroups = vm_limits_setup();
  /* The init's fd 3 is its listening socket, fd 4 the directory of its exec cgroups (rollbox-init.c). */
  int lfd_high = fcntl(lfd, F_DUPFD, 10), cgroups_high = fcntl(cgroups, F_DUPFD, 10);
  if (lfd_high < 0 || cgroups_high < 0 || dup2(lfd_high, 3) < 0 || dup2(cgroups_high, 4) < 0) vm_die("dup2");
  for (int fd = 5; fd < 64; fd++) close(fd);
  if (chdir("/newroot") < 0 || mount(".", "/", NULL, MS_MOVE, NULL) < 0 || chroot(".") < 0 || chdir("/") < 0) vm_die("switch root");
  drop_capabilities();
  char *argv[] = {"/.rollbox/init", NULL};
  char *envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", NULL};
  execve(argv[0], argv, envp);
  vm_die("exec /.rollbox/init");
}
