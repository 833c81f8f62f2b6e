/*
 * The sandbox's `pids` limit inside the guest: PID 1 (about to become rollbox-init) moves
 * into a cgroup of its own with pids.max from `rollbox.pids=N`, so every command and its
 * children count against it, as in a container; the multiplexer, forked before, stays
 * outside, so a fork bomb cannot starve the channel. The cgroup2 mount stays in the
 * initramfs, which the new root cannot reach; the sandbox has no CAP_SYS_ADMIN to mount
 * one of its own, so it cannot raise the limit.
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

void vm_limits_setup(void) {
  char pids[16];
  vm_cmdline_str("rollbox.pids", pids, sizeof pids);
  if (!pids[0]) return;
  if (mount("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) vm_die("mount cgroup2");
  put("/sys/fs/cgroup/cgroup.subtree_control", "+pids");
  if (mkdir("/sys/fs/cgroup/sandbox", 0755) < 0 && errno != EEXIST) vm_die("mkdir /sys/fs/cgroup/sandbox");
  char limit[24];
  snprintf(limit, sizeof limit, "%d\n", atoi(pids));
  put("/sys/fs/cgroup/sandbox/pids.max", limit);
  put("/sys/fs/cgroup/sandbox/cgroup.procs", "1\n");
}
