/*
 * A POSIX tar writer (ustar headers, pax records where ustar falls short) whose output
 * goes to a snapshot job's socket as 'D' records (see vminit.h): what the host reads with
 * its layer tar reader (src/layers/tar-entries.ts, tar-stream), so only what that reader
 * understands is written: pax `path`, `linkpath`, `size`, and xattrs as
 * `LIBARCHIVE.xattr.<name, %-escaped>=<base64>` (binary values survive; SCHILY's do not).
 */
#define _GNU_SOURCE
#include "tarw.h"
#include <sys/socket.h>

void tarw_init(struct tarw *t, int fd) {
  t->fd = fd;
  t->len = 1;
  t->buf[0] = 'D';
  t->total = 0;
}

int tarw_flush(struct tarw *t) {
  if (t->len <= 1) return 0;
  for (;;) {
    ssize_t w = send(t->fd, t->buf, t->len, MSG_NOSIGNAL);
    if (w == (ssize_t)t->len) break;
    if (w < 0 && errno == EINTR) continue;
    return -1; /* EPIPE: the multiplexer dropped the channel (the host cancelled) */
  }
  t->len = 1;
  return 0;
}

int tarw_put(struct tarw *t, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    size_t room = sizeof t->buf - t->len;
    size_t k = n < room ? n : room;
    memcpy(t->buf + t->len, c, k);
    t->len += k;
    t->total += k;
    c += k;
    n -= k;
    if (t->len == sizeof t->buf && tarw_flush(t) < 0) return -1;
  }
  return 0;
}

int tarw_pad(struct tarw *t, uint64_t size) {
  static const char zeros[TAR_BLOCK];
  size_t gap = (size_t)((TAR_BLOCK - size % TAR_BLOCK) % TAR_BLOCK);
  return gap ? tarw_put(t, zeros, gap) : 0;
}

/* An octal field of `len` bytes (digits, NUL); values past it in base-256 (GNU, read by tar-stream). */
static void numeric(char *field, size_t len, uint64_t v) {
  uint64_t max = (len - 1) * 3 >= 64 ? UINT64_MAX : (1ull << ((len - 1) * 3)) - 1;
  if (v <= max) {
    snprintf(field, len, "%0*llo", (int)len - 1, (unsigned long long)v);
    return;
  }
  memset(field, 0, len);
  for (size_t i = len - 1; i > 0 && v; i--, v >>= 8) field[i] = (char)(v & 0xff);
  field[0] = (char)0x80;
}

/* Appends one pax record, `LEN key=value\n` (LEN counts itself). */
int pax_add(struct pax *x, const char *key, const char *value, size_t vlen) {
  size_t body = 1 + strlen(key) + 1 + vlen + 1;
  size_t total = body + 1;
  while (snprintf(NULL, 0, "%zu", total) + body != total) total++;
  if (x->len + total > x->cap) {
    size_t cap = x->cap ? x->cap * 2 : 1024;
    while (cap < x->len + total) cap *= 2;
    char *n = realloc(x->buf, cap);
    if (!n) return -1;
    x->buf = n;
    x->cap = cap;
  }
  char *o = x->buf + x->len;
  int head = snprintf(o, x->cap - x->len, "%zu %s=", total, key);
  memcpy(o + head, value, vlen);
  o[head + vlen] = '\n';
  x->len += total;
  return 0;
}

static void header(char *h, const char *name, const struct tar_entry *e, char type, uint64_t size) {
  memset(h, 0, TAR_BLOCK);
  snprintf(h, 100, "%s", name);
  numeric(h + 100, 8, e->mode & 07777);
  numeric(h + 108, 8, e->uid);
  numeric(h + 116, 8, e->gid);
  numeric(h + 124, 12, size);
  numeric(h + 136, 12, e->mtime > 0 ? (uint64_t)e->mtime : 0);
  h[156] = type;
  if (e->link && strlen(e->link) < 100) memcpy(h + 157, e->link, strlen(e->link));
  memcpy(h + 257, "ustar", 6);
  memcpy(h + 263, "00", 2);
  numeric(h + 329, 8, 0);
  numeric(h + 337, 8, 0);
  memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < TAR_BLOCK; i++) sum += (unsigned char)h[i];
  snprintf(h + 148, 8, "%06o", sum);
  h[155] = ' ';
}

int tarw_entry(struct tarw *t, const struct tar_entry *e) {
  struct pax x = {0};
  int rc = -1;
  size_t name_len = strlen(e->path);
  int big = e->size > 077777777777ull;
  if (name_len >= 100 && pax_add(&x, "path", e->path, name_len) < 0) goto out;
  if (e->link && strlen(e->link) >= 100 && pax_add(&x, "linkpath", e->link, strlen(e->link)) < 0) goto out;
  if (big) {
    char n[24];
    int l = snprintf(n, sizeof n, "%llu", (unsigned long long)e->size);
    if (pax_add(&x, "size", n, (size_t)l) < 0) goto out;
  }
  if (e->pax_len) {
    if (x.len + e->pax_len > x.cap) {
      char *n = realloc(x.buf, x.len + e->pax_len);
      if (!n) goto out;
      x.buf = n;
      x.cap = x.len + e->pax_len;
    }
    memcpy(x.buf + x.len, e->pax, e->pax_len);
    x.len += e->pax_len;
  }
  char h[TAR_BLOCK];
  if (x.len) {
    struct tar_entry pe = {.path = "PaxHeader", .mode = 0644};
    header(h, "PaxHeader", &pe, 'x', x.len);
    if (tarw_put(t, h, TAR_BLOCK) < 0 || tarw_put(t, x.buf, x.len) < 0 || tarw_pad(t, x.len) < 0) goto out;
  }
  header(h, e->path, e, e->type, big ? 0 : e->size);
  rc = tarw_put(t, h, TAR_BLOCK);
out:
  free(x.buf);
  return rc;
}

int tarw_end(struct tarw *t) {
  static const char zeros[2 * TAR_BLOCK];
  if (tarw_put(t, zeros, sizeof zeros) < 0) return -1;
  return tarw_flush(t);
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The xattr as a pax record tar-stream's reader keeps (image-entries.ts imageXattrsOf). */
int pax_xattr(struct pax *x, const char *name, const unsigned char *v, size_t vlen) {
  char key[17 + 3 * 256 + 1] = "LIBARCHIVE.xattr.";
  size_t k = strlen(key);
  for (const char *c = name; *c && k < sizeof key - 4; c++) {
    unsigned char u = (unsigned char)*c;
    if ((u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') || u == '.' || u == '_' || u == '-') key[k++] = (char)u;
    else k += (size_t)snprintf(key + k, 4, "%%%02X", u);
  }
  key[k] = 0;
  char *b = malloc(4 * ((vlen + 2) / 3) + 1);
  if (!b) return -1;
  size_t o = 0;
  for (size_t i = 0; i < vlen; i += 3) {
    uint32_t n = (uint32_t)v[i] << 16 | (i + 1 < vlen ? (uint32_t)v[i + 1] << 8 : 0) | (i + 2 < vlen ? v[i + 2] : 0);
    b[o++] = B64[n >> 18 & 63];
    b[o++] = B64[n >> 12 & 63];
    b[o++] = i + 1 < vlen ? B64[n >> 6 & 63] : '=';
    b[o++] = i + 2 < vlen ? B64[n & 63] : '=';
  }
  int rc = pax_add(x, key, b, o);
  free(b);
  return rc;
}
