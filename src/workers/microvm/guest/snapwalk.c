/*
 * The frozen part of a snapshot: the upper dir's tree read into memory (names, types,
 * owners, modes, times, directories' xattrs and opaque marks, symlink targets,
 * whiteouts), and each regular file hard-linked into a flat stage directory beside the
 * upper dir (no data moves) so its contents can be read after the thaw even if the
 * sandbox removes or renames it. Files written in the last moments are copied outright
 * (within a budget): a log the sandbox appends to would otherwise change under its link.
 * Each link's inode ctime is kept: a file the sandbox changes later moves it, which the
 * stream checks (as the container tier's PackStage does).
 */
#define _GNU_SOURCE
#include "snapshot.h"
#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>

#define HOT_WITHIN_NS 2000000000LL
#define HOT_BUDGET_BYTES (1u << 20)
#define HOT_MAX_FILES 256
#define MAX_REL 4096
#define MAX_XATTR_VALUE (64u << 10)

int snap_fail(struct snap *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->err, sizeof s->err, fmt, ap);
  va_end(ap);
  return -1;
}

/* The host reads names as UTF-8 (tar-stream): other bytes would arrive as U+FFFD, another name. */
static int utf8_ok(const char *p) {
  const unsigned char *u = (const unsigned char *)p;
  while (*u) {
    int n = *u < 0x80 ? 0 : (*u & 0xe0) == 0xc0 ? 1 : (*u & 0xf0) == 0xe0 ? 2 : (*u & 0xf8) == 0xf0 ? 3 : -1;
    if (n < 0) return 0;
    u++;
    while (n-- > 0)
      if ((*u++ & 0xc0) != 0x80) return 0;
  }
  return 1;
}

static int kept_xattr(const char *name) {
  return !strncmp(name, "user.", 5) || !strcmp(name, "security.capability") || !strcmp(name, "system.posix_acl_access") || !strcmp(name, "system.posix_acl_default");
}

int snap_xattrs(struct snap *s, const char *path, int fd, int dir, struct pax *x) {
  static char names[64 << 10];
  static unsigned char value[MAX_XATTR_VALUE];
  ssize_t n = fd >= 0 ? flistxattr(fd, names, sizeof names) : llistxattr(path, names, sizeof names);
  if (n < 0) return errno == ENOTSUP ? 0 : snap_fail(s, "xattrs of %s: %s", path, strerror(errno));
  for (char *name = names; name < names + n; name += strlen(name) + 1) {
    int opaque = dir && !strcmp(name, "trusted.overlay.opaque");
    if (!opaque && !kept_xattr(name)) continue; /* overlay's own bookkeeping (origin, impure), selinux... */
    ssize_t v = fd >= 0 ? fgetxattr(fd, name, value, sizeof value) : lgetxattr(path, name, value, sizeof value);
    if (v < 0) {
      if (errno == ENODATA) continue;
      return snap_fail(s, "xattr %s of %s: %s", name, path, strerror(errno));
    }
    if (opaque && (v != 1 || value[0] != 'y')) continue;
    if (pax_xattr(x, name, value, (size_t)v) < 0) return snap_fail(s, "out of memory");
  }
  return 0;
}

/* The entry index of an earlier path of inode `ino`, or -1 after noting `index` as its first. */
static long first_link(struct snap *s, ino_t ino, size_t index) {
  if (s->links_n * 2 >= s->links_cap) {
    size_t cap = s->links_cap ? s->links_cap * 2 : 1024;
    int64_t *t = calloc(cap * 2, sizeof *t);
    if (!t) return -2;
    for (size_t i = 0; i < s->links_cap; i++) {
      if (!s->links[2 * i]) continue;
      size_t j = (size_t)s->links[2 * i] & (cap - 1);
      while (t[2 * j]) j = (j + 1) & (cap - 1);
      t[2 * j] = s->links[2 * i];
      t[2 * j + 1] = s->links[2 * i + 1];
    }
    free(s->links);
    s->links = t;
    s->links_cap = cap;
  }
  int64_t key = (int64_t)ino + 1; /* 0 marks an empty slot */
  size_t j = (size_t)key & (s->links_cap - 1);
  while (s->links[2 * j]) {
    if (s->links[2 * j] == key) return (long)s->links[2 * j + 1];
    j = (j + 1) & (s->links_cap - 1);
  }
  s->links[2 * j] = key;
  s->links[2 * j + 1] = (int64_t)index;
  s->links_n++;
  return -1;
}

static int later(struct timespec a, struct timespec b) { return a.tv_sec > b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec > b.tv_nsec); }

/* A regular file: a hard link of an earlier entry, copied now (hot), linked into the stage, or read later (frozen throughout). */
static int file_entry(struct snap *s, struct ent *e, int dfd, const char *name, const struct stat *st) {
  if (st->st_nlink > 1) {
    long first = first_link(s, st->st_ino, s->n);
    if (first == -2) return snap_fail(s, "out of memory");
    if (first >= 0) {
      e->kind = K_HARDLINK;
      e->target = s->ents[first].rel;
      return 0;
    }
  }
  if (s->mode != SNAP_STAGED || s->stay_frozen) return 0;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  int64_t age = (now.tv_sec - st->st_mtim.tv_sec) * 1000000000LL + (now.tv_nsec - st->st_mtim.tv_nsec);
  if (age < HOT_WITHIN_NS && s->hot_files < HOT_MAX_FILES && s->hot_bytes + (uint64_t)st->st_size <= HOT_BUDGET_BYTES) {
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return snap_fail(s, "open %s: %s", e->rel, strerror(errno));
    e->hot = malloc((size_t)st->st_size + 1);
    ssize_t got = 0;
    while (e->hot && got < st->st_size) {
      ssize_t r = read(fd, e->hot + got, (size_t)(st->st_size - got));
      if (r <= 0) break;
      got += r;
    }
    int ok = e->hot && got == st->st_size && snap_xattrs(s, e->rel, fd, 0, &e->pax) == 0;
    close(fd);
    if (!ok) return s->err[0] ? -1 : snap_fail(s, "read %s: %s", e->rel, strerror(errno));
    e->xattrs_read = 1;
    s->hot_files++;
    s->hot_bytes += (size_t)st->st_size;
    return 0;
  }
  char link[24];
  snprintf(link, sizeof link, "%ld", s->nstaged);
  struct stat ls;
  if (linkat(dfd, name, s->stage_fd, link, 0) < 0 || fstatat(s->stage_fd, link, &ls, AT_SYMLINK_NOFOLLOW) < 0) {
    /* Out of space or inodes on the sandbox's disk: the rest is read while still frozen. */
    s->stay_frozen = 1;
    return 0;
  }
  e->staged = s->nstaged++;
  e->ctime = ls.st_ctim;
  if (later(ls.st_ctim, s->max_ctime)) s->max_ctime = ls.st_ctim;
  return 0;
}

static int excluded(struct snap *s, const char *rel) {
  for (int i = 0; i < s->nexclude; i++)
    if (!strcmp(s->exclude[i], rel)) return 1;
  return 0;
}

static struct ent *add(struct snap *s, const char *rel, const struct stat *st) {
  if (s->n >= s->max_entries) return s->too_large = 1, snap_fail(s, "the writable layer has more than %u entries", s->max_entries), NULL;
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 1024;
    struct ent *n = realloc(s->ents, cap * sizeof *n);
    if (!n) return snap_fail(s, "out of memory"), NULL;
    s->ents = n;
    s->cap = cap;
  }
  struct ent *e = &s->ents[s->n];
  *e = (struct ent){.rel = strdup(rel), .mode = st->st_mode & 07777, .uid = st->st_uid, .gid = st->st_gid, .mtime = st->st_mtim.tv_sec, .size = 0, .ino = st->st_ino, .staged = -1};
  if (!e->rel) return snap_fail(s, "out of memory"), NULL;
  return e;
}

static int walk_dir(struct snap *s, int dfd, const char *rel) {
  int dup_fd = dup(dfd);
  DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
  if (!d) return snap_fail(s, "read %s: %s", *rel ? rel : "/", strerror(errno));
  int rc = 0;
  struct dirent *de;
  while (rc == 0 && (de = readdir(d))) {
    const char *name = de->d_name;
    if (!strcmp(name, ".") || !strcmp(name, "..")) continue;
    char child[MAX_REL + 1];
    if ((size_t)snprintf(child, sizeof child, "%s%s%s", rel, *rel ? "/" : "", name) >= sizeof child) {
      rc = snap_fail(s, "a path longer than %d bytes under /%s", MAX_REL, rel);
      break;
    }
    if (excluded(s, child)) continue;
    if (!utf8_ok(name)) {
      rc = snap_fail(s, "/%s: the name is not UTF-8", rel);
      break;
    }
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
      rc = snap_fail(s, "stat /%s: %s", child, strerror(errno));
      break;
    }
    if (S_ISSOCK(st.st_mode) || S_ISBLK(st.st_mode) || (S_ISCHR(st.st_mode) && st.st_rdev != makedev(0, 0))) {
      s->skipped++;
      continue;
    }
    struct ent *e = add(s, child, &st);
    if (!e) {
      rc = -1;
      break;
    }
    char at[MAX_REL + 64];
    snprintf(at, sizeof at, "/proc/self/fd/%d/%s", dfd, name);
    if (S_ISDIR(st.st_mode)) {
      e->kind = K_DIR;
      s->n++;
      int cfd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (cfd < 0) rc = snap_fail(s, "open /%s: %s", child, strerror(errno));
      else {
        rc = snap_xattrs(s, at, cfd, 1, &s->ents[s->n - 1].pax);
        if (rc == 0) rc = walk_dir(s, cfd, child);
        close(cfd);
      }
      continue;
    }
    if (S_ISREG(st.st_mode)) {
      e->kind = K_FILE;
      e->size = (uint64_t)st.st_size;
      rc = file_entry(s, e, dfd, name, &st);
    } else if (S_ISLNK(st.st_mode)) {
      char target[MAX_REL + 1];
      ssize_t l = readlinkat(dfd, name, target, sizeof target - 1);
      if (l < 0 || l >= MAX_REL) rc = snap_fail(s, "readlink /%s: %s", child, l < 0 ? strerror(errno) : "too long");
      else {
        target[l] = 0;
        if (!utf8_ok(target)) rc = snap_fail(s, "/%s: the link's target is not UTF-8", child);
        else if (!(e->target = strdup(target))) rc = snap_fail(s, "out of memory");
      }
      e->kind = K_SYMLINK;
      e->xattrs_read = 1;
    } else if (S_ISCHR(st.st_mode)) {
      e->kind = K_WHITEOUT;
      e->xattrs_read = 1;
    } else {
      e->kind = K_FIFO;
      rc = snap_xattrs(s, at, -1, 0, &e->pax);
      e->xattrs_read = 1;
    }
    s->n++;
  }
  closedir(d);
  return rc;
}

int snap_walk(struct snap *s) {
  struct stat st;
  if (fstat(s->upper_fd, &st) < 0) return snap_fail(s, "stat the upper dir: %s", strerror(errno));
  struct ent *root = add(s, "", &st);
  if (!root) return -1;
  root->kind = K_DIR;
  s->n++;
  if (snap_xattrs(s, UPPER_DIR, s->upper_fd, 1, &s->ents[0].pax) < 0) return -1;
  return walk_dir(s, s->upper_fd, "");
}
