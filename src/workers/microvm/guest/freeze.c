/*
 * Freezing the sandbox inside the guest: cgroup2's freezer on the sandbox's cgroup
 * (limits.c), below which are every process the init ever started (each command's exec
 * cgroup) and the init itself (/sandbox/init), and not the multiplexer or its children: a
 * freeze of /sandbox freezes all its descendants, and its cgroup.events says "frozen 1"
 * only once every one of them is. A snapshot freezes the sandbox only while it
 * copies the writable layer's tree as hard links (snapshot.c), a stage change while it
 * mounts and unmounts (hide.c), and a pause freezes it before QEMU stops the vCPUs, so a
 * snapshot of a paused VM can run the guest's side without its processes running.
 *
 * Writing 1 to cgroup.freeze only starts the freeze: a process in the middle of a system
 * call is frozen on its way out of it. cgroup.events says "frozen 1" once all are.
 */
#define _GNU_SOURCE
#include "vminit.h"
#include <fcntl.h>
#include <poll.h>
#include <time.h>

/* A process stuck in uninterruptible sleep this long: the freeze is given up (and undone). */
#define FREEZE_TIMEOUT_MS 10000

static int write_freeze(int on) {
  int fd = open(SANDBOX_CGROUP "/cgroup.freeze", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t w = write(fd, on ? "1\n" : "0\n", 2);
  int saved = errno;
  close(fd);
  errno = saved;
  return w == 2 ? 0 : -1;
}

static long now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

int vm_freeze(int on) {
  if (write_freeze(on) < 0) return -1;
  if (!on) return 0;
  int fd = open(SANDBOX_CGROUP "/cgroup.events", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  long until = now_ms() + FREEZE_TIMEOUT_MS;
  for (;;) {
    char buf[256] = {0};
    ssize_t r = pread(fd, buf, sizeof buf - 1, 0);
    if (r > 0 && strstr(buf, "frozen 1")) break;
    long left = until - now_ms();
    if (r < 0 || left <= 0) {
      close(fd);
      write_freeze(0);
      errno = r < 0 ? errno : ETIMEDOUT;
      return -1;
    }
    /* cgroup.events notifies a change with POLLPRI; the short cap covers a missed one. */
    struct pollfd p = {.fd = fd, .events = POLLPRI};
    poll(&p, 1, left < 20 ? (int)left : 20);
  }
  close(fd);
  return 0;
}

int vm_is_frozen(void) {
  char c = '0';
  int fd = open(SANDBOX_CGROUP "/cgroup.freeze", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  if (read(fd, &c, 1) != 1) c = '0';
  close(fd);
  return c == '1';
}
