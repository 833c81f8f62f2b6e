/*
 * The sandbox's cgroups inside the guest, as a container's on the host: cgroup2 mounted in
 * the initramfs with the memory and pids controllers, and one tree for everything of the
 * sandbox:
 *
 *   /sandbox        pids.max from `rollbox.pids=N` (every command and its children count
 *                   against it); cgroup.freeze, which freezes all below it (freeze.c)
 *   /sandbox/init   PID 1 (about to become rollbox-init)
 *   /sandbox/aN     the init's exec cgroups beside it, made and read by the init through
 *                   the directory it is handed (fd 4, rollbox-init's slots.c): each command
 *                   runs in one, so the OOM kills it suffers are counted in its own
 *                   memory.events
 *
 * The multiplexer (and a snapshot's packer, its child), forked before, stays outside: a
 * fork bomb cannot starve the channel and a freeze never stops it. The cgroup2 mount stays
 * in the initramfs, which the new root cannot reach; the sandbox has no CAP_SYS_ADMIN to
 * mount one of its own, so it can neither raise its limit, touch a count nor thaw itself.
 */
#define _GNU_SOURCE
#include "vminit.h"
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>

static void put(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) vm_die(path);
  if (write(fd, text, strlen(text)) < 0) vm_die(path);
  close(fd);
}

static void make(const char *path) {
  if (mkdir(path, 0755) < 0 && errno != EEXIST) vm_die(path);
}

int vm_limits_setup(void) {
  if (mount("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) vm_die("mount cgroup2");
  put("/sys/fs/cgroup/cgroup.subtree_control", "+pids +memory");
  make(SANDBOX_CGROUP);
  char pids[16];
  vm_cmdline_str("rollbox.pids", pids, sizeof pids);
  if (pids[0]) {
    char limit[24];
    snprintf(limit, sizeof limit, "%d\n", atoi(pids));
    put(SANDBOX_CGROUP "/pids.max", limit);
  }
  /* Controllers for the exec cgroups below it: /sandbox itself then holds no process (cgroup2's rule). */
  put(SANDBOX_CGROUP "/cgroup.subtree_control", "+pids +memory");
  make(SANDBOX_CGROUP "/init");
  put(SANDBOX_CGROUP "/init/cgroup.procs", "1\n");
  int dir = open(SANDBOX_CGROUP, O_RDONLY | O_DIRECTORY);
  if (dir < 0) vm_die(SANDBOX_CGROUP);
  return dir;
}

/*
 * MUX_IDENTITY (the multiplexer, which kept every capability): the guest's hostname (one UTS
 * namespace: the sandbox's too) and, when given, /sandbox's pids limit. At boot the host
 * names the VM; a fork's child, whose memory is its parent's, is renamed before its first
 * command and may get another pids limit.
 */
int vm_set_identity(const char *p, size_t len) {
  if (len < 5 || len > 4 + 64) return EINVAL;
  uint32_t pids = 0;
  for (int i = 0; i < 4; i++) pids |= (uint32_t)(unsigned char)p[i] << (8 * i);
  if (memchr(p + 4, 0, len - 4)) return EINVAL;
  if (sethostname(p + 4, len - 4) < 0) return errno;
  if (pids) {
    char limit[24];
    snprintf(limit, sizeof limit, "%u\n", pids);
    int fd = open(SANDBOX_CGROUP "/pids.max", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    int err = write(fd, limit, strlen(limit)) < 0 ? errno : 0;
    close(fd);
    if (err) return err;
  }
  return 0;
}
