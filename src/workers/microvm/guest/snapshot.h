/* A snapshot job's state, shared by its walk (snapwalk.c) and its stream (snapshot.c). */
#ifndef ROLLBOX_SNAPSHOT_H
#define ROLLBOX_SNAPSHOT_H

#include "tarw.h"
#include <sys/stat.h>
#include <time.h>

/* The writable layer (the overlay's upper dir) and, beside it on the same disk, the hard-link stage. */
#define UPPER_DIR "/disk/upper"
#define STAGE_DIR "/disk/.rollbox-snap"

enum ent_kind { K_DIR, K_FILE, K_HARDLINK, K_SYMLINK, K_WHITEOUT, K_FIFO };

struct ent {
  char *rel;          /* relative to the upper dir; "" is its root */
  unsigned char kind;
  uint32_t mode, uid, gid;
  int64_t mtime;
  uint64_t size;
  ino_t ino;
  char *target;       /* a symlink's target, or a hard link's earlier path */
  long staged;        /* its stage link's number, or -1: read from the upper dir (frozen still) */
  struct timespec ctime; /* the inode's, once its stage link was made */
  char *hot;          /* a file written in the last moments: its contents, copied while frozen */
  int xattrs_read;    /* pax below already holds its xattrs */
  struct pax pax;
};

struct snap {
  int mode;           /* SNAP_STAGED, SNAP_FROZEN or SNAP_HELD */
  uint32_t max_entries;
  const char **exclude;
  int nexclude;
  struct ent *ents;
  size_t n, cap;
  uint32_t skipped;   /* sockets and device nodes: no layer holds them */
  int upper_fd, stage_fd;
  int stay_frozen;    /* the stage could not be made (disk full): streamed frozen throughout */
  long nstaged;
  size_t hot_bytes;
  int hot_files;
  struct timespec max_ctime;
  int64_t *links;     /* hard links: an open-addressing table of (ino, entry index) pairs */
  size_t links_cap, links_n;
  int too_large;      /* past the host's entry cap: answered as its own status */
  char err[512];
};

int snap_fail(struct snap *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reads the tree under the upper dir into s->ents, staging files when mode is SNAP_STAGED. */
int snap_walk(struct snap *s);
/* Extended attributes of `path` a layer keeps, into `x`; `dir`: the opaque mark counts. */
int snap_xattrs(struct snap *s, const char *path, int fd, int dir, struct pax *x);

#endif
