/*
 * The sandbox's cgroup inside the guest: PID 1 (about to become rollbox-init) moves into a
 * cgroup of its own, so every command and its children are in it, as in a container; the
 * multiplexer, forked before, stays outside. It carries the `pids` limit (from
 * `rollbox.pids=N`), so a fork bomb cannot starve the channel, and it is what the guest
 * freezes (freeze.c). The cgroup2 mount stays in the initramfs, which the new root cannot
 * reach; the sandbox has no CAP_SYS_ADMIN to mount one of its own, so it can neither raise
 * its limit nor thaw itself.
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
  if (mount("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) vm_die("mount cgroup2");
  if (pids[0]) put("/sys/fs/cgroup/cgroup.subtree_control", "+pids");
  if (mkdir(SANDBOX_CGROUP, 0755) < 0 && errno != EEXIST) vm_die("mkdir " SANDBOX_CGROUP);
  if (pids[0]) {
    char limit[24];
    snprintf(limit, sizeof limit, "%d\n", atoi(pids));
    put(SANDBOX_CGROUP "/pids.max", limit);
  }
  put(SANDBOX_CGROUP "/cgroup.procs", "1\n");
}
