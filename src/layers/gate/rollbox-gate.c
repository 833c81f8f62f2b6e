/*
 * rollbox-gate: fills a worker host's lazy layer blobs on first read.
 *
 * A split layer is an EROFS metadata image plus a data blob. A host that lacks the layer
 * keeps the metadata local and the blob as a sparse file of its full size, and mounts the
 * meta with `device=<blob>` (file-backed: no loop device). This process holds a fanotify
 * group of class FAN_CLASS_PRE_CONTENT with a FAN_PRE_ACCESS mark on every incomplete blob:
 * each read of a blob (EROFS reads file contents through the backing file) waits in the
 * kernel until the gate answers. Chunks already present are answered at once; missing ones
 * are asked of the worker's fetcher over a unix socket, which fetches them by HTTP range,
 * checks their sha256 and sends the bytes here. The gate writes them through an fd it opened
 * before the mark (so its own writes raise no events) and allows the reads (they read the
 * page cache); every SYNC_MS it fdatasyncs what it wrote and only then records those chunks
 * in the blob's map (one byte per chunk, shared mmap: a crash can lose a "present", never
 * claim an unwritten chunk; a failed sync takes the chunks back). A fetch that fails is
 * answered FAN_DENY with EIO: the reader gets an I/O error, never zeros.
 *
 * What keeps "never zeros" true when processes die:
 *   - the fetcher (the worker) gone: events wait for a grace (a restarted worker reconnects
 *     and is asked again), then are denied with EIO;
 *   - the gate gone: the kernel would ALLOW every pending event and drop the marks when the
 *     group's last fd closes (fanotify_release), and holes would read as zeros. So a keeper,
 *     forked from the gate, holds a copy of the group's fd and of every blob's fds. A new
 *     gate (the worker starts one) takes them over through the keeper's socket, answers the
 *     events the dead gate had read with EIO (responses are keyed by fd number, so it answers
 *     every number the dead gate could have used before it reads anything itself) and goes on
 *     with the same group and marks: mounts stay valid.
 *   - both gone at once: the group is released; the worker notices that the new gate does
 *     not hold its blobs and fails the sandboxes that use them before they can read again.
 *
 * Usage:
 *   rollbox-gate serve DIR [GRACE_MS [EVENT_TIMEOUT_MS]]   (DIR/gate.sock, DIR/keeper.sock)
 *   rollbox-gate mount META TARGET BLOB [directio]          (mount(2) of a split layer)
 *
 * Worker protocol (stream socket; frames: u32 LE length of what follows, u8 type, body):
 *   worker -> gate: ATTACH id[64] u64 size u32 chunk u16 n path[n] u16 m mappath[m]
 *                   DETACH id | DATA id u32 chunk bytes | FAIL id u32 first u32 count u32 errno
 *                   LIST | SHUTDOWN
 *   gate -> worker: HELLO u32 pid u32 keeper u32 version u8 tookOver
 *                   ATTACHED id u32 present u32 total i32 errno | NEED id u32 first u32 count
 *                   WRITTEN id u32 chunk i32 errno | LISTED u32 n (id u32 present u32 total u32 waiting)*
 *                   DETACHED id | BUSY u32 attached
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fanotify.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* Newer than the libc headers here (kernel 6.14+). */
#define X_FAN_CLASS_PRE_CONTENT 0x00000008
#define X_FAN_PRE_ACCESS 0x00100000
#define X_FAN_EVENT_INFO_TYPE_RANGE 6
#define X_FAN_DENY_EIO (FAN_DENY | ((uint32_t)EIO << 24))

#define PROTO_VERSION 1
#define ID_LEN 64
#define MAX_BLOBS 4096
#define MAX_PENDING 65536
/* Event fds stay below this: a successor answers every number up to it. */
#define EVENT_FD_LIMIT 65536
/* Written chunks are synced and recorded in the maps this often (reads of them are allowed at once). */
#define SYNC_MS 200
/* Holding no blob and with no worker this long, the gate (and its keeper) ends: nothing needs it. */
#define IDLE_EXIT_MS 60000

enum { M_ATTACH = 1, M_DETACH, M_DATA, M_FAIL, M_LIST, M_SHUTDOWN };
enum { R_HELLO = 101, R_ATTACHED, R_NEED, R_WRITTEN, R_LISTED, R_DETACHED, R_BUSY };
enum { K_HOLD = 'H', K_DROP = 'D', K_EXIT = 'X', K_FAN = 'F', K_BLOB = 'B' };

struct blob {
  int used;
  char id[ID_LEN];
  uint64_t size;
  uint32_t chunk, nchunks, present;
  int wfd, mapfd;
  dev_t dev;
  ino_t ino;
  uint8_t *map;      /* shared mmap of the map file: 1 = chunk written and synced (what survives a crash) */
  uint8_t *have;     /* written (in the page cache at least): reads of it are allowed */
  uint8_t *inflight; /* asked of the worker, not answered yet */
  uint8_t *unsynced; /* written, not yet fdatasynced (not yet in the map) */
  int dirty;
  int marked;
};

struct pending {
  int fd; /* the event's fd: also its key for the answer */
  int blob;
  uint32_t first, last;
  int64_t since_ms;
};

static struct blob blobs[MAX_BLOBS];
static struct pending *pending;
static int npending;
static int fan = -1, listen_fd = -1, worker = -1, link_fd = -1, lock_fd = -1;
static pid_t keeper_pid;
static int64_t grace_ms = 10000, event_timeout_ms = 120000, worker_gone_ms;
static const char *dir;

static void logf_(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "rollbox-gate[%d]: ", getpid());
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

static uint32_t chunk_len(const struct blob *b, uint32_t i) {
  uint64_t start = (uint64_t)i * b->chunk;
  uint64_t end = start + b->chunk < b->size ? start + b->chunk : b->size;
  return (uint32_t)(end - start);
}

/* ---- worker connection ---- */

static void drop_worker(const char *why);
static void sync_written(void);

/* Blocking send with a deadline: a worker that stops reading is treated as gone. */
static int send_all(int fd, const void *buf, size_t len) {
  const uint8_t *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd pf = {.fd = fd, .events = POLLOUT};
      if (poll(&pf, 1, 5000) == 1) continue;
    }
    return -1;
  }
  return 0;
}

static void reply(uint8_t type, const void *body, uint32_t len) {
  if (worker < 0) return;
  uint8_t head[5];
  put32(head, len + 1);
  head[4] = type;
  if (send_all(worker, head, 5) < 0 || (len && send_all(worker, body, len) < 0)) drop_worker("send failed");
}

static void reply_id3(uint8_t type, const char *id, uint32_t a, uint32_t b, uint32_t c, int n) {
  uint8_t body[ID_LEN + 12];
  memcpy(body, id, ID_LEN);
  put32(body + ID_LEN, a);
  put32(body + ID_LEN + 4, b);
  put32(body + ID_LEN + 8, c);
  reply(type, body, ID_LEN + 4 * (uint32_t)n);
}

/* ---- events ---- */

static void answer(int fd, uint32_t response) {
  struct fanotify_response r = {.fd = fd, .response = response};
  if (write(fan, &r, sizeof r) != (ssize_t)sizeof r) logf_("answering event fd %d: %s", fd, strerror(errno));
  close(fd);
}

static int all_present(const struct blob *b, uint32_t first, uint32_t last) {
  for (uint32_t i = first; i <= last; i++)
    if (!b->have[i]) return 0;
  return 1;
}

/* Ask the worker for the missing chunks of [first, last] not already asked, as runs. */
static void request_missing(int bi, uint32_t first, uint32_t last) {
  struct blob *b = &blobs[bi];
  if (worker < 0) return;
  uint32_t i = first;
  while (i <= last) {
    if (b->have[i] || b->inflight[i]) {
      i++;
      continue;
    }
    uint32_t start = i;
    while (i <= last && !b->have[i] && !b->inflight[i]) b->inflight[i++] = 1;
    reply_id3(R_NEED, b->id, start, i - start, 0, 2);
  }
}

static void deny_where(int bi, uint32_t first, uint32_t count) {
  for (int k = 0; k < npending;) {
    struct pending *p = &pending[k];
    if (p->blob == bi && p->first < first + count && first <= p->last && !all_present(&blobs[bi], p->first, p->last)) {
      answer(p->fd, X_FAN_DENY_EIO);
      pending[k] = pending[--npending];
    } else
      k++;
  }
}

static void allow_ready(int bi) {
  for (int k = 0; k < npending;) {
    struct pending *p = &pending[k];
    if (p->blob == bi && all_present(&blobs[bi], p->first, p->last)) {
      answer(p->fd, FAN_ALLOW);
      pending[k] = pending[--npending];
    } else
      k++;
  }
}

static int blob_of_inode(dev_t dev, ino_t ino) {
  for (int i = 0; i < MAX_BLOBS; i++)
    if (blobs[i].used && blobs[i].dev == dev && blobs[i].ino == ino) return i;
  return -1;
}

static void handle_event(struct fanotify_event_metadata *m) {
  if (m->fd < 0) return;
  if (!(m->mask & X_FAN_PRE_ACCESS)) {
    answer(m->fd, FAN_ALLOW);
    return;
  }
  uint64_t off = 0, count = 0;
  int has_range = 0;
  for (uint8_t *p = (uint8_t *)m + m->metadata_len; p + sizeof(struct fanotify_event_info_header) <= (uint8_t *)m + m->event_len;) {
    struct fanotify_event_info_header *h = (void *)p;
    if (h->len == 0) break;
    if (h->info_type == X_FAN_EVENT_INFO_TYPE_RANGE && h->len >= 24) {
      off = get64(p + 8);
      count = get64(p + 16);
      has_range = 1;
    }
    p += h->len;
  }
  struct stat st;
  int bi = fstat(m->fd, &st) == 0 ? blob_of_inode(st.st_dev, st.st_ino) : -1;
  if (bi < 0) {
    /* Not a blob we hold: it was detached; nothing may read it unfilled. */
    answer(m->fd, X_FAN_DENY_EIO);
    return;
  }
  struct blob *b = &blobs[bi];
  if (!has_range) {
    off = 0;
    count = b->size;
  }
  if (count == 0 || off >= b->size || b->present == b->nchunks) {
    answer(m->fd, FAN_ALLOW);
    return;
  }
  if (off + count > b->size) count = b->size - off;
  uint32_t first = (uint32_t)(off / b->chunk), last = (uint32_t)((off + count - 1) / b->chunk);
  if (all_present(b, first, last)) {
    answer(m->fd, FAN_ALLOW);
    return;
  }
  if ((worker < 0 && now_ms() - worker_gone_ms >= grace_ms) || npending >= MAX_PENDING) {
    answer(m->fd, X_FAN_DENY_EIO);
    return;
  }
  pending[npending++] = (struct pending){.fd = m->fd, .blob = bi, .first = first, .last = last, .since_ms = now_ms()};
  request_missing(bi, first, last);
}

static void read_events(void) {
  static uint8_t buf[64 * 1024] __attribute__((aligned(8)));
  for (;;) {
    ssize_t len = read(fan, buf, sizeof buf);
    if (len <= 0) return;
    for (struct fanotify_event_metadata *m = (void *)buf; FAN_EVENT_OK(m, len); m = FAN_EVENT_NEXT(m, len)) handle_event(m);
  }
}

/* ---- the keeper ---- */

static void send_fds(int sock, const void *body, size_t len, const int *fds, int nfds) {
  struct iovec iov = {.iov_base = (void *)body, .iov_len = len};
  char cbuf[CMSG_SPACE(sizeof(int) * 2)];
  memset(cbuf, 0, sizeof cbuf);
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds) {
    mh.msg_control = cbuf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
  }
  if (sendmsg(sock, &mh, MSG_NOSIGNAL) < 0) logf_("sendmsg to keeper link: %s", strerror(errno));
}

/* One SOCK_SEQPACKET message and up to 2 fds; returns its length (<= 0: closed). */
static ssize_t recv_fds(int sock, uint8_t *body, size_t cap, int *fds, int *nfds) {
  struct iovec iov = {.iov_base = body, .iov_len = cap};
  char cbuf[CMSG_SPACE(sizeof(int) * 2)];
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
  ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  *nfds = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    if (k > 2) k = 2;
    memcpy(fds, CMSG_DATA(c), sizeof(int) * (size_t)k);
    *nfds = k;
  }
  return n;
}

static void hold_in_keeper(const struct blob *b) {
  if (link_fd < 0) return;
  uint8_t body[1 + ID_LEN + 12];
  body[0] = K_HOLD;
  memcpy(body + 1, b->id, ID_LEN);
  put64(body + 1 + ID_LEN, b->size);
  put32(body + 1 + ID_LEN + 8, b->chunk);
  int fds[2] = {b->wfd, b->mapfd};
  send_fds(link_fd, body, sizeof body, fds, 2);
}

static int bind_unix(const char *path, int type) {
  int s = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  memcpy(a.sun_path, path, strlen(path) + 1);
  unlink(path);
  if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 8) < 0) {
    logf_("listening on %s: %s", path, strerror(errno));
    exit(1);
  }
  return s;
}

#define SUN_PATH_MAX sizeof(((struct sockaddr_un *)0)->sun_path)
static char keeper_path[SUN_PATH_MAX], gate_path[SUN_PATH_MAX], lock_path[4096];

/* DIR/gate.pid and DIR/keeper.pid: who holds what, for operators (and tests) to look at. */
static void write_pid(const char *name, pid_t pid) {
  char p[4096], tmp[4200], text[32];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  snprintf(tmp, sizeof tmp, "%s.tmp", p);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return;
  int n = snprintf(text, sizeof text, "%d\n", pid);
  if (write(fd, text, (size_t)n) == n) rename(tmp, p);
  close(fd);
}

/*
 * The keeper: a fork of the gate that only holds fds (the group's, and each blob's writer
 * and map), so that none is closed when the gate dies. It hands them to the next gate.
 */
static void keeper_main(int link) {
  /* Everything else of the gate's is not the keeper's. */
  int keep[2 * MAX_BLOBS + 2], nkeep = 0;
  keep[nkeep++] = fan;
  keep[nkeep++] = link;
  for (int i = 0; i < MAX_BLOBS; i++)
    if (blobs[i].used) {
      keep[nkeep++] = blobs[i].wfd;
      keep[nkeep++] = blobs[i].mapfd;
    }
  for (int fd = 3; fd < EVENT_FD_LIMIT + 64; fd++) {
    int k = 0;
    for (int j = 0; j < nkeep; j++) k |= keep[j] == fd;
    if (!k) close(fd);
  }
  int lsock = bind_unix(keeper_path, SOCK_SEQPACKET);
  write_pid("keeper.pid", getpid());
  for (int i = 0; i < MAX_BLOBS; i++) {
    if (blobs[i].used && blobs[i].map) munmap(blobs[i].map, blobs[i].nchunks);
    free(blobs[i].inflight);
    free(blobs[i].unsynced);
    free(blobs[i].have);
  }
  for (;;) {
    struct pollfd p[2] = {{.fd = link, .events = POLLIN}, {.fd = lsock, .events = POLLIN}};
    if (poll(p, 2, -1) < 0) continue;
    if (link >= 0 && p[0].revents) {
      uint8_t body[1 + ID_LEN + 12];
      int fds[2], nfds;
      ssize_t n = recv_fds(link, body, sizeof body, fds, &nfds);
      if (n <= 0) {
        close(link);
        link = -1; /* the gate is gone: keep everything for the next one */
      } else if (body[0] == K_EXIT) {
        _exit(0);
      } else if (body[0] == K_HOLD && n == (ssize_t)sizeof body && nfds == 2) {
        int slot = -1;
        for (int i = 0; i < MAX_BLOBS && slot < 0; i++)
          if (!blobs[i].used) slot = i;
        if (slot < 0) {
          close(fds[0]);
          close(fds[1]);
        } else {
          blobs[slot] = (struct blob){.used = 1, .size = get64(body + 1 + ID_LEN), .chunk = get32(body + 1 + ID_LEN + 8), .wfd = fds[0], .mapfd = fds[1]};
          memcpy(blobs[slot].id, body + 1, ID_LEN);
        }
      } else if (body[0] == K_DROP && n >= 1 + ID_LEN) {
        for (int i = 0; i < MAX_BLOBS; i++)
          if (blobs[i].used && !memcmp(blobs[i].id, body + 1, ID_LEN)) {
            close(blobs[i].wfd);
            close(blobs[i].mapfd);
            blobs[i].used = 0;
          }
        for (int i = 0; i < nfds; i++) close(fds[i]);
      } else
        for (int i = 0; i < nfds; i++) close(fds[i]);
    }
    if (p[1].revents) {
      int c = accept4(lsock, NULL, NULL, SOCK_CLOEXEC);
      if (c < 0) continue;
      if (link >= 0) { /* a gate is alive: nobody else takes over */
        close(c);
        continue;
      }
      uint32_t count = 0;
      for (int i = 0; i < MAX_BLOBS; i++) count += blobs[i].used;
      uint8_t head[5] = {K_FAN};
      put32(head + 1, count);
      send_fds(c, head, sizeof head, &fan, 1);
      for (int i = 0; i < MAX_BLOBS; i++) {
        if (!blobs[i].used) continue;
        uint8_t body[1 + ID_LEN + 12];
        body[0] = K_BLOB;
        memcpy(body + 1, blobs[i].id, ID_LEN);
        put64(body + 1 + ID_LEN, blobs[i].size);
        put32(body + 1 + ID_LEN + 8, blobs[i].chunk);
        int fds[2] = {blobs[i].wfd, blobs[i].mapfd};
        send_fds(c, body, sizeof body, fds, 2);
      }
      link = c;
    }
  }
}

static void fork_keeper(void) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
    logf_("socketpair: %s", strerror(errno));
    return;
  }
  pid_t pid = fork();
  if (pid < 0) {
    logf_("fork keeper: %s", strerror(errno));
    close(sv[0]);
    close(sv[1]);
    return;
  }
  if (pid == 0) {
    signal(SIGTERM, SIG_DFL);
    keeper_main(sv[1]);
    _exit(0);
  }
  close(sv[1]);
  link_fd = sv[0];
  keeper_pid = pid;
}

/* ---- blobs ---- */

static int setup_blob(int slot, const char *id, uint64_t size, uint32_t chunk, int wfd, int mapfd) {
  struct blob *b = &blobs[slot];
  struct stat st, ms;
  if (chunk < 4096 || (chunk & (chunk - 1)) || fstat(wfd, &st) < 0 || fstat(mapfd, &ms) < 0) return EINVAL;
  uint64_t n = (size + chunk - 1) / chunk;
  if ((uint64_t)st.st_size != size || (uint64_t)ms.st_size != n || n > UINT32_MAX) return EINVAL;
  *b = (struct blob){.used = 1, .size = size, .chunk = chunk, .nchunks = (uint32_t)n, .wfd = wfd, .mapfd = mapfd, .dev = st.st_dev, .ino = st.st_ino};
  memcpy(b->id, id, ID_LEN);
  if (n > 0) {
    b->map = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, mapfd, 0);
    if (b->map == MAP_FAILED) {
      b->used = 0;
      return errno;
    }
  }
  b->inflight = calloc(n ? n : 1, 1);
  b->unsynced = calloc(n ? n : 1, 1);
  b->have = calloc(n ? n : 1, 1);
  for (uint32_t i = 0; i < b->nchunks; i++) {
    b->have[i] = b->map[i] == 1;
    b->present += b->have[i];
  }
  return 0;
}

static int find_blob(const char *id) {
  for (int i = 0; i < MAX_BLOBS; i++)
    if (blobs[i].used && !memcmp(blobs[i].id, id, ID_LEN)) return i;
  return -1;
}

static void unmark(struct blob *b) {
  if (!b->marked) return;
  if (fanotify_mark(fan, FAN_MARK_REMOVE, X_FAN_PRE_ACCESS, b->wfd, NULL) < 0 && errno != ENOENT) logf_("unmarking a blob: %s", strerror(errno));
  b->marked = 0;
}

static void attach(const uint8_t *body, uint32_t len) {
  if (len < ID_LEN + 16) return;
  const char *id = (const char *)body;
  uint64_t size = get64(body + ID_LEN);
  uint32_t chunk = get32(body + ID_LEN + 8);
  uint32_t plen = (uint32_t)body[ID_LEN + 12] | (uint32_t)body[ID_LEN + 13] << 8;
  if (ID_LEN + 14 + plen + 2 > len) return;
  uint32_t mlen = (uint32_t)body[ID_LEN + 14 + plen] | (uint32_t)body[ID_LEN + 15 + plen] << 8;
  if (ID_LEN + 16 + plen + mlen > len || plen >= 4096 || mlen >= 4096) return;
  char path[4096], mpath[4096];
  memcpy(path, body + ID_LEN + 14, plen);
  path[plen] = 0;
  memcpy(mpath, body + ID_LEN + 16 + plen, mlen);
  mpath[mlen] = 0;
  int bi = find_blob(id);
  if (bi >= 0) { /* attached already (a worker restart): say how far it is */
    reply_id3(R_ATTACHED, id, blobs[bi].present, blobs[bi].nchunks, 0, 3);
    return;
  }
  int slot = -1;
  for (int i = 0; i < MAX_BLOBS && slot < 0; i++)
    if (!blobs[i].used) slot = i;
  /* Opened before the mark: writes through this fd raise no pre-content events. */
  int wfd = open(path, O_RDWR | O_CLOEXEC);
  int mapfd = open(mpath, O_RDWR | O_CLOEXEC);
  int err = slot < 0 ? ENOSPC : wfd < 0 || mapfd < 0 ? errno : setup_blob(slot, id, size, chunk, wfd, mapfd);
  if (!err && blobs[slot].present < blobs[slot].nchunks) {
    if (fanotify_mark(fan, FAN_MARK_ADD, X_FAN_PRE_ACCESS, wfd, NULL) < 0) err = errno;
    else blobs[slot].marked = 1;
  }
  if (err) {
    if (slot >= 0 && blobs[slot].used) {
      if (blobs[slot].map) munmap(blobs[slot].map, blobs[slot].nchunks);
      free(blobs[slot].inflight);
      free(blobs[slot].unsynced);
      free(blobs[slot].have);
      blobs[slot].used = 0;
    }
    if (wfd >= 0) close(wfd);
    if (mapfd >= 0) close(mapfd);
    logf_("attaching %.*s: %s", ID_LEN, id, strerror(err));
    reply_id3(R_ATTACHED, id, 0, 0, (uint32_t)err, 3);
    return;
  }
  hold_in_keeper(&blobs[slot]);
  reply_id3(R_ATTACHED, id, blobs[slot].present, blobs[slot].nchunks, 0, 3);
}

static void detach(const char *id) {
  int bi = find_blob(id);
  if (bi >= 0) {
    struct blob *b = &blobs[bi];
    if (b->dirty) sync_written();
    deny_where(bi, 0, b->nchunks);
    unmark(b);
    if (b->map) munmap(b->map, b->nchunks);
    free(b->inflight);
    free(b->unsynced);
    close(b->wfd);
    close(b->mapfd);
    b->used = 0;
    if (link_fd >= 0) {
      uint8_t body[1 + ID_LEN] = {K_DROP};
      memcpy(body + 1, id, ID_LEN);
      send_fds(link_fd, body, sizeof body, NULL, 0);
    }
  }
  reply_id3(R_DETACHED, id, 0, 0, 0, 0);
}

static void data(const uint8_t *body, uint32_t len) {
  if (len < ID_LEN + 4) return;
  int bi = find_blob((const char *)body);
  uint32_t i = get32(body + ID_LEN);
  if (bi < 0) {
    reply_id3(R_WRITTEN, (const char *)body, i, (uint32_t)ENOENT, 0, 2);
    return;
  }
  struct blob *b = &blobs[bi];
  uint32_t n = len - ID_LEN - 4;
  if (i >= b->nchunks || n != chunk_len(b, i)) {
    b->inflight[i < b->nchunks ? i : 0] = 0;
    reply_id3(R_WRITTEN, b->id, i, (uint32_t)EINVAL, 0, 2);
    if (i < b->nchunks) deny_where(bi, i, 1);
    return;
  }
  if (b->have[i]) {
    b->inflight[i] = 0;
    reply_id3(R_WRITTEN, b->id, i, 0, 0, 2);
    return;
  }
  const uint8_t *p = body + ID_LEN + 4;
  uint64_t off = (uint64_t)i * b->chunk;
  for (uint32_t done = 0; done < n;) {
    ssize_t w = pwrite(b->wfd, p + done, n - done, (off_t)(off + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int err = w < 0 ? errno : EIO;
      logf_("writing chunk %u of %.*s: %s", i, ID_LEN, b->id, strerror(err));
      b->inflight[i] = 0;
      reply_id3(R_WRITTEN, b->id, i, (uint32_t)err, 0, 2);
      deny_where(bi, i, 1);
      return;
    }
    done += (uint32_t)w;
  }
  b->have[i] = 1;
  b->present++;
  b->inflight[i] = 0;
  b->unsynced[i] = 1;
  b->dirty = 1;
  reply_id3(R_WRITTEN, b->id, i, 0, 0, 2);
}

static void mark(struct blob *b) {
  if (b->marked) return;
  if (fanotify_mark(fan, FAN_MARK_ADD, X_FAN_PRE_ACCESS, b->wfd, NULL) < 0) logf_("marking a blob again: %s", strerror(errno));
  else b->marked = 1;
}

/* After a batch of writes: the reads waiting on them go on (they read the page cache). */
static void allow_written(void) {
  for (int bi = 0; bi < MAX_BLOBS; bi++) {
    struct blob *b = &blobs[bi];
    if (!b->used || !b->dirty) continue;
    allow_ready(bi);
    if (b->present == b->nchunks) unmark(b); /* complete: an ordinary local file from now on */
  }
}

/*
 * Synced first, then recorded: the map never says "present" of a chunk not on disk. A sync
 * that fails (the disk lost writes) takes those chunks back: marked again, fetched again.
 */
static int64_t last_sync_ms;
static void sync_written(void) {
  last_sync_ms = now_ms();
  for (int bi = 0; bi < MAX_BLOBS; bi++) {
    struct blob *b = &blobs[bi];
    if (!b->used || !b->dirty) continue;
    b->dirty = 0;
    int err = fdatasync(b->wfd) < 0 ? errno : 0;
    if (err) logf_("syncing %.*s: %s; its new chunks are fetched again", ID_LEN, b->id, strerror(err));
    for (uint32_t i = 0; i < b->nchunks; i++) {
      if (!b->unsynced[i]) continue;
      b->unsynced[i] = 0;
      if (!err) b->map[i] = 1;
      else if (b->have[i]) {
        b->have[i] = 0;
        b->present--;
      }
    }
    if (err) mark(b);
  }
}

static int any_dirty(void) {
  for (int bi = 0; bi < MAX_BLOBS; bi++)
    if (blobs[bi].used && blobs[bi].dirty) return 1;
  return 0;
}

static void fail(const uint8_t *body, uint32_t len) {
  if (len < ID_LEN + 12) return;
  int bi = find_blob((const char *)body);
  if (bi < 0) return;
  uint32_t first = get32(body + ID_LEN), count = get32(body + ID_LEN + 4);
  struct blob *b = &blobs[bi];
  for (uint64_t i = first; i < (uint64_t)first + count && i < b->nchunks; i++) b->inflight[i] = 0;
  deny_where(bi, first, count);
}

static void list(void) {
  uint32_t n = 0;
  for (int i = 0; i < MAX_BLOBS; i++) n += blobs[i].used;
  uint8_t *out = malloc(4 + (size_t)n * (ID_LEN + 12));
  put32(out, n);
  size_t at = 4;
  for (int i = 0; i < MAX_BLOBS; i++) {
    if (!blobs[i].used) continue;
    uint32_t waiting = 0;
    for (int k = 0; k < npending; k++) waiting += pending[k].blob == i;
    memcpy(out + at, blobs[i].id, ID_LEN);
    put32(out + at + ID_LEN, blobs[i].present);
    put32(out + at + ID_LEN + 4, blobs[i].nchunks);
    put32(out + at + ID_LEN + 8, waiting);
    at += ID_LEN + 12;
  }
  reply(R_LISTED, out, (uint32_t)at);
  free(out);
}

static void drop_worker(const char *why) {
  if (worker < 0) return;
  logf_("worker connection closed (%s)", why);
  close(worker);
  worker = -1;
  worker_gone_ms = now_ms();
  /* Asked of the connection that is gone: a reconnecting worker is asked again. */
  for (int i = 0; i < MAX_BLOBS; i++)
    if (blobs[i].used) memset(blobs[i].inflight, 0, blobs[i].nchunks ? blobs[i].nchunks : 1);
}

static void hello(int tookover) {
  uint8_t body[13];
  put32(body, (uint32_t)getpid());
  put32(body + 4, (uint32_t)keeper_pid);
  put32(body + 8, PROTO_VERSION);
  body[12] = (uint8_t)tookover;
  reply(R_HELLO, body, sizeof body);
  for (int k = 0; k < npending; k++) request_missing(pending[k].blob, pending[k].first, pending[k].last);
}

static void shutdown_if_idle(void) {
  uint32_t n = 0;
  for (int i = 0; i < MAX_BLOBS; i++) n += blobs[i].used;
  if (n) {
    uint8_t body[4];
    put32(body, n);
    reply(R_BUSY, body, 4);
    return;
  }
  if (link_fd >= 0) {
    uint8_t x = K_EXIT;
    send_fds(link_fd, &x, 1, NULL, 0);
    /* Its end of the link closes when it has exited: the gate goes last (it reaps its child). */
    struct pollfd pf = {.fd = link_fd, .events = POLLIN};
    uint8_t b;
    while (poll(&pf, 1, 1000) == 1 && recv(link_fd, &b, 1, 0) > 0) {
    }
  }
  unlink(gate_path);
  unlink(keeper_path);
  char p[4096];
  snprintf(p, sizeof p, "%s/gate.pid", dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/keeper.pid", dir);
  unlink(p);
  exit(0);
}

/* ---- takeover from a keeper ---- */

static int take_over(void) {
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  memcpy(a.sun_path, keeper_path, strlen(keeper_path) + 1);
  if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
    if (s >= 0) close(s);
    return 0;
  }
  uint8_t body[1 + ID_LEN + 12];
  int fds[2], nfds;
  ssize_t n = recv_fds(s, body, sizeof body, fds, &nfds);
  if (n != 5 || body[0] != K_FAN || nfds != 1) { /* refused: another gate is alive */
    close(s);
    return -1;
  }
  fan = fds[0];
  uint32_t count = get32(body + 1);
  for (uint32_t k = 0; k < count; k++) {
    n = recv_fds(s, body, sizeof body, fds, &nfds);
    if (n != (ssize_t)sizeof body || body[0] != K_BLOB || nfds != 2) {
      logf_("takeover: keeper sent a malformed blob");
      continue;
    }
    int slot = -1;
    for (int i = 0; i < MAX_BLOBS && slot < 0; i++)
      if (!blobs[i].used) slot = i;
    if (slot < 0 || setup_blob(slot, (const char *)body + 1, get64(body + 1 + ID_LEN), get32(body + 1 + ID_LEN + 8), fds[0], fds[1])) {
      logf_("takeover: cannot set up a blob");
      continue;
    }
    blobs[slot].marked = blobs[slot].present < blobs[slot].nchunks;
  }
  int fl = fcntl(fan, F_GETFL);
  fcntl(fan, F_SETFL, fl | O_NONBLOCK);
  /* The dead gate's events wait on their fd numbers: answer every number it could have used. */
  for (int fd = 0; fd < EVENT_FD_LIMIT; fd++) {
    struct fanotify_response r = {.fd = fd, .response = X_FAN_DENY_EIO};
    ssize_t w = write(fan, &r, sizeof r);
    (void)w;
  }
  for (int i = 0; i < MAX_BLOBS; i++)
    if (blobs[i].used && blobs[i].present == blobs[i].nchunks) unmark(&blobs[i]);
  link_fd = s;
  keeper_pid = 0;
  struct ucred cred;
  socklen_t cl = sizeof cred;
  if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0) keeper_pid = cred.pid;
  logf_("took over from keeper %d: %u blobs", keeper_pid, count);
  return 1;
}

/* ---- main loop ---- */

static uint8_t *inbuf;
static size_t inlen, incap;

static void handle_message(const uint8_t *msg, uint32_t len) {
  uint8_t type = msg[0];
  const uint8_t *body = msg + 1;
  uint32_t blen = len - 1;
  switch (type) {
  case M_ATTACH: attach(body, blen); break;
  case M_DETACH:
    if (blen >= ID_LEN) detach((const char *)body);
    break;
  case M_DATA: data(body, blen); break;
  case M_FAIL: fail(body, blen); break;
  case M_LIST: list(); break;
  case M_SHUTDOWN: shutdown_if_idle(); break;
  default: drop_worker("unknown message");
  }
}

static void read_worker(void) {
  for (;;) {
    if (incap - inlen < 65536) {
      incap = incap ? incap * 2 : 1 << 20;
      inbuf = realloc(inbuf, incap);
    }
    ssize_t n = recv(worker, inbuf + inlen, incap - inlen, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      drop_worker(n == 0 ? "closed" : strerror(errno));
      inlen = 0;
      break;
    }
    if (n < 0) break;
    inlen += (size_t)n;
    size_t at = 0;
    while (worker >= 0 && inlen - at >= 4) {
      uint32_t len = get32(inbuf + at);
      if (len == 0 || len > (64u << 20) + 4096) {
        drop_worker("oversized message");
        break;
      }
      if (inlen - at - 4 < len) {
        if (len + 4 > incap) {
          incap = len + 4 + 65536;
          inbuf = realloc(inbuf, incap);
        }
        break;
      }
      handle_message(inbuf + at + 4, len);
      at += 4 + len;
    }
    if (worker < 0) {
      inlen = 0;
      break;
    }
    memmove(inbuf, inbuf + at, inlen - at);
    inlen -= at;
  }
  allow_written();
}

static void expire(void) {
  int64_t t = now_ms();
  int gone = worker < 0 && t - worker_gone_ms >= grace_ms;
  for (int k = 0; k < npending;) {
    if (gone || t - pending[k].since_ms >= event_timeout_ms) {
      answer(pending[k].fd, X_FAN_DENY_EIO);
      pending[k] = pending[--npending];
    } else
      k++;
  }
}

static int serve(void) {
  if (strlen(dir) + sizeof "/keeper.sock" > SUN_PATH_MAX) {
    logf_("%s: too long for a unix socket path", dir);
    return 64;
  }
  snprintf(gate_path, sizeof gate_path, "%s/gate.sock", dir);
  snprintf(keeper_path, sizeof keeper_path, "%s/keeper.sock", dir);
  snprintf(lock_path, sizeof lock_path, "%s/gate.lock", dir);
  lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0 || flock(lock_fd, LOCK_EX | LOCK_NB) < 0) {
    logf_("another gate runs for %s", dir);
    return 3;
  }
  struct rlimit rl = {.rlim_cur = EVENT_FD_LIMIT, .rlim_max = EVENT_FD_LIMIT};
  struct rlimit cur;
  if (getrlimit(RLIMIT_NOFILE, &cur) == 0 && cur.rlim_max < EVENT_FD_LIMIT) rl.rlim_cur = rl.rlim_max = cur.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  signal(SIGPIPE, SIG_IGN);
  signal(SIGCHLD, SIG_IGN); /* the keeper is reaped by the kernel */
  write_pid("gate.pid", getpid());
  pending = calloc(MAX_PENDING, sizeof *pending);
  int tookover = take_over();
  if (tookover < 0) {
    logf_("the keeper refused: a gate is alive");
    return 3;
  }
  if (!tookover) {
    fan = fanotify_init(X_FAN_CLASS_PRE_CONTENT | FAN_CLOEXEC | FAN_NONBLOCK | FAN_UNLIMITED_QUEUE, O_RDONLY | O_LARGEFILE | O_CLOEXEC);
    if (fan < 0) {
      logf_("fanotify_init(FAN_CLASS_PRE_CONTENT): %s", strerror(errno));
      return 2;
    }
    fork_keeper();
  }
  listen_fd = bind_unix(gate_path, SOCK_STREAM);
  worker_gone_ms = now_ms();
  logf_("serving %s (grace %lld ms)", dir, (long long)grace_ms);
  for (;;) {
    struct pollfd p[4] = {{.fd = fan, .events = POLLIN}, {.fd = listen_fd, .events = POLLIN}, {.fd = worker, .events = POLLIN}, {.fd = link_fd, .events = POLLIN}};
    int attached = 0;
    for (int i = 0; i < MAX_BLOBS && !attached; i++) attached = blobs[i].used;
    int idle = worker < 0 && !attached;
    if (idle && now_ms() - worker_gone_ms >= IDLE_EXIT_MS) {
      logf_("idle (no blob, no worker) for %d s: exiting", IDLE_EXIT_MS / 1000);
      shutdown_if_idle();
    }
    int dirty = any_dirty();
    int timeout = npending || dirty ? (dirty ? SYNC_MS : 100) : idle ? 1000 : -1;
    if (poll(p, 4, timeout) < 0 && errno != EINTR) return 1;
    if (dirty && now_ms() - last_sync_ms >= SYNC_MS) sync_written();
    if (p[3].revents) { /* the keeper died: a new one, from what the gate holds now */
      uint8_t b[8];
      ssize_t n = recv(link_fd, b, sizeof b, MSG_DONTWAIT);
      if (n <= 0 && !(n < 0 && errno == EAGAIN)) {
        logf_("keeper gone; forking a new one");
        close(link_fd);
        link_fd = -1;
        fork_keeper();
      }
    }
    if (p[1].revents) {
      int c = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
      if (c >= 0) {
        if (worker >= 0) drop_worker("replaced by a new connection");
        worker = c;
        inlen = 0;
        hello(tookover);
      }
    }
    if (worker >= 0 && p[2].revents) read_worker();
    if (p[0].revents) read_events();
    expire();
  }
}

static int mount_split(int argc, char **argv) {
  if (argc < 5) return 64;
  char opts[8192];
  int n = snprintf(opts, sizeof opts, "device=%s%s", argv[4], argc > 5 && !strcmp(argv[5], "directio") ? ",directio" : "");
  if (n < 0 || (size_t)n >= sizeof opts) return 64;
  if (mount(argv[2], argv[3], "erofs", MS_RDONLY | MS_NODEV | MS_NOSUID, opts) < 0) {
    fprintf(stderr, "mount %s on %s (device=%s): %s\n", argv[2], argv[3], argv[4], strerror(errno));
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "mount")) return mount_split(argc, argv);
  if (argc >= 3 && !strcmp(argv[1], "serve")) {
    dir = argv[2];
    if (argc > 3) grace_ms = atoll(argv[3]);
    if (argc > 4) event_timeout_ms = atoll(argv[4]);
    return serve();
  }
  fprintf(stderr, "usage: rollbox-gate serve DIR [GRACE_MS [EVENT_TIMEOUT_MS]] | mount META TARGET BLOB [directio]\n");
  return 64;
}
