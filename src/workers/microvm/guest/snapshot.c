/*
 * A snapshot (pack_diff) of a microVM's writable layer, made inside the guest by a child
 * of the multiplexer (outside the sandbox: not in its cgroup, not dumpable, never execs),
 * and streamed to the host as a tar over the channel. The host never mounts the disk the
 * guest wrote; it reads the tar as untrusted input, through its safe tar -> EROFS writer.
 *
 * The overlay's own marks go as overlayfs keeps them: a whiteout as a 0:0 character
 * device, an opaque directory with its `trusted.overlay.opaque` xattr ("y"). Hidden and
 * excluded paths are left out, sockets and device nodes too (no layer holds them).
 *
 * Modes (the host picks): SNAP_STAGED freezes the sandbox only while the tree is read and
 * its files hard-linked into a stage (snapwalk.c), then streams thawed, and answers
 * "changed" (status 1) if a linked file changed before it was read, so the host asks
 * again with SNAP_FROZEN: frozen while the whole tar streams. SNAP_HELD: the sandbox is
 * frozen already (a paused VM) and stays so.
 *
 * The result record: 'R', u32 status (0 ok, 1 changed, 2 failed, 3 past the entry cap), u32 entries, u32
 * skipped, u64 frozen microseconds, u64 tar bytes, then the failure's message.
 */
#define _GNU_SOURCE
#include "snapshot.h"
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>


enum { ST_OK = 0, ST_CHANGED = 1, ST_FAILED = 2, ST_TOO_LARGE = 3 };

static int64_t mono_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000LL + t.tv_nsec / 1000;
}

static void put32(char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (char)(v >> (8 * i));
}

static void result(int sock, int status, const struct snap *s, int64_t frozen_us, uint64_t bytes) {
  char r[1 + 28 + sizeof s->err];
  r[0] = 'R';
  put32(r + 1, (uint32_t)status);
  put32(r + 5, (uint32_t)s->n);
  put32(r + 9, s->skipped);
  put32(r + 13, (uint32_t)frozen_us);
  put32(r + 17, (uint32_t)((uint64_t)frozen_us >> 32));
  put32(r + 21, (uint32_t)bytes);
  put32(r + 25, (uint32_t)(bytes >> 32));
  size_t m = status >= ST_FAILED ? strlen(s->err) : 0;
  memcpy(r + 29, s->err, m);
  send(sock, r, 29 + m, MSG_NOSIGNAL);
}

/* A flat directory of hard links: unlinked entry by entry, then removed. */
void snapshot_clear_stage(void) {
  int fd = open(STAGE_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    DIR *d = fdopendir(fd);
    struct dirent *de;
    while (d && (de = readdir(d)))
      if (de->d_name[0] != '.') unlinkat(fd, de->d_name, 0);
    if (d) closedir(d);
    else close(fd);
  }
  rmdir(STAGE_DIR);
}

/* Whether `fd` is still the inode as it was at the freeze (a staged file changes under its link). */
static int same(const struct ent *e, int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_ino == e->ino && st.st_ctim.tv_sec == e->ctime.tv_sec && st.st_ctim.tv_nsec == e->ctime.tv_nsec;
}

/* A regular file's header and contents; 1 when a staged file changed since the freeze. */
static int stream_file(struct snap *s, struct tarw *t, struct ent *e, struct tar_entry *te) {
  if (e->hot) {
    if (tarw_entry(t, te) < 0 || tarw_put(t, e->hot, e->size) < 0 || tarw_pad(t, e->size) < 0) return snap_fail(s, "the host stopped reading");
    return 0;
  }
  int fd;
  char name[24];
  if (e->staged >= 0) {
    snprintf(name, sizeof name, "%ld", e->staged);
    fd = openat(s->stage_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  } else {
    /* Frozen still: nothing moves, and no symlink is followed on the way. */
    struct open_how_v0 how = {.flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
    fd = (int)syscall(SYS_openat2, s->upper_fd, e->rel, &how, sizeof how);
  }
  if (fd < 0) return snap_fail(s, "open /%s: %s", e->rel, strerror(errno));
  int rc = 0;
  if (e->staged >= 0 && !same(e, fd)) rc = 1;
  else if (snap_xattrs(s, e->rel, fd, 0, &e->pax) < 0) rc = -1;
  else {
    te->pax = e->pax.buf;
    te->pax_len = e->pax.len;
    if (tarw_entry(t, te) < 0) rc = snap_fail(s, "the host stopped reading");
  }
  static char buf[64 << 10];
  for (uint64_t left = e->size; rc == 0 && left > 0;) {
    ssize_t r = read(fd, buf, left < sizeof buf ? left : sizeof buf);
    if (r <= 0) {
      /* Shorter than at the freeze: changed (staged), or an I/O error. */
      rc = e->staged >= 0 ? 1 : snap_fail(s, "read /%s: %s", e->rel, r < 0 ? strerror(errno) : "shorter than it was");
      break;
    }
    if (tarw_put(t, buf, (size_t)r) < 0) rc = snap_fail(s, "the host stopped reading");
    left -= (uint64_t)r;
  }
  if (rc == 0 && e->staged >= 0 && !same(e, fd)) rc = 1;
  if (rc == 0 && tarw_pad(t, e->size) < 0) rc = snap_fail(s, "the host stopped reading");
  close(fd);
  return rc;
}

/* Every entry, in the walk's order (a directory before what it holds, a file before its hard links). */
static int stream(struct snap *s, struct tarw *t) {
  for (size_t i = 0; i < s->n; i++) {
    struct ent *e = &s->ents[i];
    char path[4096 + 3];
    snprintf(path, sizeof path, "%s%s", *e->rel ? e->rel : ".", e->kind == K_DIR ? "/" : "");
    struct tar_entry te = {.path = path, .mode = e->mode, .uid = e->uid, .gid = e->gid, .mtime = e->mtime, .pax = e->pax.buf, .pax_len = e->pax.len};
    static const char types[] = {[K_DIR] = '5', [K_FILE] = '0', [K_HARDLINK] = '1', [K_SYMLINK] = '2', [K_WHITEOUT] = '3', [K_FIFO] = '6'};
    te.type = types[e->kind];
    if (e->kind == K_FILE) {
      te.size = e->size;
      int rc = stream_file(s, t, e, &te);
      if (rc) return rc;
      continue;
    }
    if (e->kind == K_HARDLINK || e->kind == K_SYMLINK) te.link = e->target;
    if (e->kind == K_HARDLINK) te.pax = NULL, te.pax_len = 0;
    if (tarw_entry(t, &te) < 0) return snap_fail(s, "the host stopped reading");
  }
  return tarw_end(t) < 0 ? snap_fail(s, "the host stopped reading") : 0;
}

/* Until the coarse clock (inode times) is past every staged link's ctime: a change after the thaw then moves it. */
static void past_ctimes(const struct snap *s) {
  for (;;) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME_COARSE, &now);
    if (now.tv_sec > s->max_ctime.tv_sec || (now.tv_sec == s->max_ctime.tv_sec && now.tv_nsec > s->max_ctime.tv_nsec)) return;
    struct timespec t = {0, 500 * 1000};
    nanosleep(&t, NULL);
  }
}

void snapshot_main(int sock, const char *body, size_t len) {
  signal(SIGPIPE, SIG_IGN);
  /* A directory fd per level of the walk: a path of 4096 bytes can be 2048 levels deep. */
  struct rlimit files = {4096 + 64, 4096 + 64};
  setrlimit(RLIMIT_NOFILE, &files);
  struct snap s = {.upper_fd = -1, .stage_fd = -1};
  struct tarw *t = malloc(sizeof *t);
  const char *exclude[512];
  int status = ST_FAILED, froze = 0, thawed = 0;
  int64_t frozen_at = 0, frozen_us = 0;
  if (!t || len < 8) {
    snap_fail(&s, "a bad snapshot request");
    goto done;
  }
  s.mode = (int)((uint32_t)(unsigned char)body[0] | (uint32_t)(unsigned char)body[1] << 8 | (uint32_t)(unsigned char)body[2] << 16 | (uint32_t)(unsigned char)body[3] << 24);
  s.max_entries = (uint32_t)(unsigned char)body[4] | (uint32_t)(unsigned char)body[5] << 8 | (uint32_t)(unsigned char)body[6] << 16 | (uint32_t)(unsigned char)body[7] << 24;
  for (size_t off = 8; off < len && s.nexclude < 512;) {
    size_t l = strnlen(body + off, len - off);
    if (off + l >= len) break;
    const char *p = body + off;
    while (*p == '/') p++;
    if (*p) exclude[s.nexclude++] = p;
    off += l + 1;
  }
  s.exclude = exclude;
  tarw_init(t, sock);
  s.upper_fd = open(UPPER_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (s.upper_fd < 0) {
    snap_fail(&s, "open the upper dir: %s", strerror(errno));
    goto done;
  }
  /* A stage left by a snapshot that was cut short (its job killed). */
  snapshot_clear_stage();
  if (s.mode == SNAP_STAGED) {
    if (mkdir(STAGE_DIR, 0700) < 0 || (s.stage_fd = open(STAGE_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) s.stay_frozen = 1;
    /* Written back first, while the sandbox runs: the links' journal commit would wait for the disk's dirty data. */
    syncfs(s.upper_fd);
  }
  if (s.mode == SNAP_HELD) {
    if (!vm_is_frozen()) {
      snap_fail(&s, "the sandbox is not frozen");
      goto done;
    }
  } else {
    frozen_at = mono_us();
    if (vm_freeze(1) < 0) {
      snap_fail(&s, "freezing the sandbox: %s", strerror(errno));
      goto done;
    }
    froze = 1;
  }
  if (snap_walk(&s) < 0) goto done;
  if (s.mode == SNAP_STAGED && !s.stay_frozen) {
    past_ctimes(&s);
    vm_freeze(0);
    frozen_us = mono_us() - frozen_at;
    thawed = 1;
  }
  int rc = stream(&s, t);
  status = rc == 0 ? ST_OK : rc == 1 ? ST_CHANGED : ST_FAILED;
done:
  if (froze && !thawed) {
    vm_freeze(0);
    frozen_us = mono_us() - frozen_at;
  }
  if (s.mode == SNAP_STAGED) snapshot_clear_stage();
  if (t) tarw_flush(t);
  if (status == ST_FAILED && s.too_large) status = ST_TOO_LARGE;
  result(sock, status, &s, frozen_us, t ? t->total : 0);
  _exit(0);
}
