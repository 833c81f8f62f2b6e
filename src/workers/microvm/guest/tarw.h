/* The snapshot's tar writer (tarw.c). */
#ifndef ROLLBOX_TARW_H
#define ROLLBOX_TARW_H

#include "vminit.h"

#define TAR_BLOCK 512

struct tarw {
  int fd;
  size_t len;     /* bytes in buf, the record's type byte included */
  uint64_t total; /* tar bytes written */
  char buf[JOB_RECORD_MAX];
};

/* Pax records being built (extended attributes, long names). */
struct pax {
  char *buf;
  size_t len, cap;
};

struct tar_entry {
  const char *path;  /* relative; a directory's ends in '/' */
  char type;         /* '0' file, '1' hard link, '2' symlink, '3' char device, '5' directory, '6' FIFO */
  uint32_t mode, uid, gid;
  int64_t mtime;
  uint64_t size;     /* a regular file's; 0 for the rest */
  const char *link;  /* symlink target, or a hard link's earlier path */
  const char *pax;   /* this entry's own pax records (xattrs) */
  size_t pax_len;
};

void tarw_init(struct tarw *t, int fd);
/* Header (with a pax header before it when needed); the file's bytes follow with tarw_put, then tarw_pad. */
int tarw_entry(struct tarw *t, const struct tar_entry *e);
int tarw_put(struct tarw *t, const void *p, size_t n);
int tarw_pad(struct tarw *t, uint64_t size);
int tarw_flush(struct tarw *t);
int tarw_end(struct tarw *t);
int pax_add(struct pax *x, const char *key, const char *value, size_t vlen);
int pax_xattr(struct pax *x, const char *name, const unsigned char *value, size_t vlen);

#endif
