/*
 * rollbox-init: what the init reads and makes of its exec cgroups ("slots", see
 * rollbox-init.c), through the cgroup directories it was handed (fds 4..6: a container's
 * v1 pids, freezer and memory cgroups; in a microVM, fd 4 alone, the guest's cgroup2
 * /sandbox, all controllers in one tree). Nothing in the sandbox can reach these: they
 * are not mounted in its root, and the init and its keepers are not dumpable.
 */
#define _GNU_SOURCE
#include "init.h"

/* A small cgroup file of `slot` under the first cgroup directory that has it, NUL-ended; -1 when none has. */
static ssize_t read_slot_file(const char *slot, const char *file, char *buf, size_t len) {
  char rel[MAX_SLOT_NAME + 40];
  snprintf(rel, sizeof rel, "%s/%s", slot, file);
  for (int i = 0; i < CGROUP_FDS; i++) {
    if (cgroup_fds[i] < 0) continue;
    int fd = openat(cgroup_fds[i], rel, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    if (n < 0) continue;
    buf[n] = 0;
    return n;
  }
  return -1;
}

/*
 * The OOM kills the kernel counted in a slot's memory cgroup: `oom_kill` of cgroup2's
 * memory.events or v1's memory.oom_control (the kernel counts every OOM kill, the guest's
 * global ones too, in the victim's memory cgroup). 0 when the slot has no memory cgroup.
 */
uint32_t slot_oom_kills(const char *slot) {
  static const char *const files[] = {"memory.events", "memory.oom_control"};
  char buf[1024];
  if (!slot[0]) return 0;
  for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
    if (read_slot_file(slot, files[f], buf, sizeof buf) < 0) continue;
    for (char *line = buf; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
      if (!strncmp(line, "oom_kill ", 9)) return (uint32_t)strtoul(line + 9, NULL, 10);
  }
  return 0;
}

/* Processes in a slot (its keeper counts one); -1 when the slot is not there. */
int slot_population(const char *slot) {
  char buf[4096];
  if (read_slot_file(slot, "cgroup.procs", buf, sizeof buf) < 0) return -1;
  int n = 0;
  for (char *p = buf; *p; p++)
    if (*p == '\n') n++;
  return n;
}

/* Makes a slot in every cgroup directory the init has (made already is fine). */
int slot_make(const char *slot) {
  int made = 0;
  for (int i = 0; i < CGROUP_FDS; i++) {
    if (cgroup_fds[i] < 0) continue;
    if (mkdirat(cgroup_fds[i], slot, 0755) < 0 && errno != EEXIST) return -1;
    made = 1;
  }
  if (!made) errno = ENOENT;
  return made ? 0 : -1;
}
