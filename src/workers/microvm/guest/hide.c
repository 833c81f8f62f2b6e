/*
 * Hidden paths of a microVM sandbox, kept by the multiplexer (the trusted side, outside
 * the sandbox): as in a container (runc's maskedPaths, src/workers/runtime/mountns.ts), a
 * directory is covered by an empty read-only tmpfs (mode 000) and anything else by a
 * read-only bind of /dev/null. The sandbox's processes have no CAP_SYS_ADMIN (stage0.c
 * drops it from the bounding set), so they cannot unmount, move or bind around the
 * covers; they cannot make user namespaces either (stage0.c: max_user_namespaces 0 and a
 * read-only /proc/sys), where the covers would be locked mounts anyway.
 *
 * The host sends the whole set wanted now (MUX_POLICY): at create before the first
 * command, at each task stage, after a wake. The guest knows what it covered, so it
 * reveals what is no longer wanted (only covers it made) and covers what is new, with
 * the sandbox frozen so no process sees half a change. Paths are resolved inside the
 * sandbox's root (openat2 RESOLVE_IN_ROOT: its symlinks, never a way out), a final
 * symlink is refused before anything changes (hide its target instead), and a path that
 * does not exist is left alone. Each cover is held by an O_PATH fd on its own root, so
 * revealing unmounts that very mount wherever the sandbox renamed its parent to.
 */
#define _GNU_SOURCE
#include "vminit.h"
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>


#define MAX_HIDDEN 256

struct hidden {
  char *path;
  int fd; /* O_PATH on the cover's root; -1: nothing was there to cover */
};
static struct hidden hidden[MAX_HIDDEN];
static int nhidden;
static int root_fd = -1;

void hide_init(int root) { root_fd = root; }

/* `path` (absolute, in the sandbox) opened O_PATH without following a final symlink. */
static int resolve(const char *path) {
  while (*path == '/') path++;
  struct open_how_v0 how = {.flags = O_PATH | O_NOFOLLOW | O_CLOEXEC, .resolve = RESOLVE_IN_ROOT};
  return (int)syscall(SYS_openat2, root_fd, *path ? path : ".", &how, sizeof how);
}

static int wanted(const char *path, const char *const *set, int n) {
  for (int i = 0; i < n; i++)
    if (!strcmp(set[i], path)) return 1;
  return 0;
}

static int index_of(const char *path) {
  for (int i = 0; i < nhidden; i++)
    if (!strcmp(hidden[i].path, path)) return i;
  return -1;
}

/* Covers `path`: the new hidden entry's fd (-1 when there is nothing at the path), or -2 with errno. */
static int cover(const char *path) {
  int fd = resolve(path);
  if (fd < 0) return errno == ENOENT ? -1 : -2;
  struct stat st;
  char target[64];
  snprintf(target, sizeof target, "/proc/self/fd/%d", fd);
  int r;
  if (fstat(fd, &st) < 0) r = -1;
  else if (S_ISLNK(st.st_mode)) r = (errno = ELOOP, -1);
  else if (S_ISDIR(st.st_mode)) r = mount("rollbox-hidden", target, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=000");
  else r = mount("/dev/null", target, NULL, MS_BIND, NULL);
  int saved = errno;
  close(fd);
  if (r < 0) return (errno = saved, -2);
  /* The path again, now through the cover: its root, which later reveals unmount. */
  int covered = resolve(path);
  if (covered < 0) return -2;
  if (!S_ISDIR(st.st_mode)) {
    snprintf(target, sizeof target, "/proc/self/fd/%d", covered);
    if (mount(NULL, target, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL) < 0) {
      saved = errno;
      umount2(target, MNT_DETACH);
      close(covered);
      return (errno = saved, -2);
    }
  }
  return covered;
}

/* Lazily: a process whose cwd is inside the empty cover keeps it; the path shows what is below at once. */
static void uncover(int fd) {
  if (fd < 0) return;
  char target[64];
  snprintf(target, sizeof target, "/proc/self/fd/%d", fd);
  if (umount2(target, MNT_DETACH) < 0) vm_log("hide: unmount of a cover: %s", strerror(errno));
  close(fd);
}

static int add(const char *path, int fd) {
  char *copy = strdup(path);
  if (!copy) return -1;
  hidden[nhidden++] = (struct hidden){copy, fd};
  return 0;
}

static void drop(int i) {
  free(hidden[i].path);
  hidden[i] = hidden[--nhidden];
}

int hide_apply(const char *body, size_t len, char *err, size_t errlen) {
  const char *set[MAX_HIDDEN];
  int n = 0;
  for (size_t off = 0; off < len;) {
    const char *p = body + off;
    size_t l = strnlen(p, len - off);
    if (off + l >= len || n >= MAX_HIDDEN || p[0] != '/' || !p[1]) return snprintf(err, errlen, "hidden paths: a bad list"), -1;
    set[n++] = p;
    off += l + 1;
  }
  /* Refused before anything changes: a final symlink (the container tier refuses it too). */
  for (int i = 0; i < n; i++) {
    if (index_of(set[i]) >= 0) continue;
    int fd = resolve(set[i]);
    if (fd < 0) continue;
    struct stat st;
    int link = fstat(fd, &st) == 0 && S_ISLNK(st.st_mode);
    close(fd);
    if (link) return snprintf(err, errlen, "%s is a symbolic link; hide its target instead", set[i]), -1;
  }
  int was_frozen = vm_is_frozen();
  if (!was_frozen && vm_freeze(1) < 0) return snprintf(err, errlen, "freezing the sandbox: %s", strerror(errno)), -1;
  /* Reveals first: a directory revealed and a file inside it hidden in one stage. */
  char *revealed[MAX_HIDDEN];
  int nrevealed = 0, failed = 0;
  for (int i = nhidden - 1; i >= 0; i--) {
    if (wanted(hidden[i].path, set, n)) continue;
    uncover(hidden[i].fd);
    revealed[nrevealed++] = hidden[i].path;
    hidden[i] = hidden[--nhidden];
  }
  int first_new = nhidden;
  for (int i = 0; i < n && !failed; i++) {
    if (index_of(set[i]) >= 0) continue;
    int fd = cover(set[i]);
    if (fd == -2 || add(set[i], fd) < 0) {
      snprintf(err, errlen, "hide %s: %s", set[i], strerror(errno));
      failed = 1;
    }
  }
  if (failed) {
    /* As far as the kernel lets us: the stage before, whole. */
    while (nhidden > first_new) {
      uncover(hidden[nhidden - 1].fd);
      drop(nhidden - 1);
    }
    for (int i = 0; i < nrevealed; i++) {
      int fd = cover(revealed[i]);
      if (fd != -2) add(revealed[i], fd);
    }
  }
  for (int i = 0; i < nrevealed; i++) free(revealed[i]);
  if (!was_frozen) vm_freeze(0);
  return failed ? -1 : 0;
}
