/*
 * The channel multiplexer of a rollbox microVM: the only holder of the virtio-serial port.
 * For each channel the host opens it connects to rollbox-init's listening socket and
 * relays bytes both ways, so the init sees one connection per command exactly as in a
 * container. Code in the sandbox cannot write on the port: the port's device node is not
 * in the sandbox's /dev, CAP_MKNOD and CAP_SYS_ADMIN are gone from every process the init
 * starts, and this process is not dumpable (its fds need CAP_SYS_PTRACE).
 *
 * The port has no connections: while no host end is attached, poll reports POLLHUP. That
 * ends every channel (the init then treats their commands as abandoned, as a dropped
 * connection), and the multiplexer waits for the host to come back (a restored snapshot,
 * a restarted worker), never exits.
 *
 * Requests to this trusted side itself (snapshots, hidden paths, freezes) are requests.c's.
 */
#define _GNU_SOURCE
#include "mux.h"
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

struct chan *chans[MUX_MAX_CHANNELS];
int nchans;
/*
 * Bytes for the host not yet written to the port: out[out_off .. out_len). Written from an
 * offset, moved down only when a frame needs the room: the port takes at most 32 KiB per
 * write, and moving a full buffer after each would copy it ~30 times per MiB sent.
 */
static char *out;
static size_t out_off, out_len, out_cap;
/* Bytes from the host not yet parsed into frames. */
static char in[MUX_HEADER_BYTES + MUX_MAX_PAYLOAD];
static size_t in_len;

void put32(char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (char)(v >> (8 * i));
}
uint32_t get32(const char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)(unsigned char)p[i] << (8 * i);
  return v;
}

void queue(uint32_t id, int kind, const char *payload, size_t len) {
  if (out_len + MUX_HEADER_BYTES + len > out_cap && out_off > 0) {
    memmove(out, out + out_off, out_len - out_off);
    out_len -= out_off;
    out_off = 0;
  }
  if (out_len + MUX_HEADER_BYTES + len > out_cap) {
    size_t cap = out_cap ? out_cap : 65536;
    while (cap < out_len + MUX_HEADER_BYTES + len) cap *= 2;
    char *n = realloc(out, cap);
    if (!n) vm_die("realloc");
    out = n;
    out_cap = cap;
  }
  char *h = out + out_len;
  memset(h, 0, MUX_HEADER_BYTES);
  put32(h, id);
  h[4] = (char)kind;
  put32(h + 8, (uint32_t)len);
  if (len) memcpy(h + MUX_HEADER_BYTES, payload, len);
  out_len += MUX_HEADER_BYTES + len;
}

struct chan *chan_of(uint32_t id) {
  for (int i = 0; i < nchans; i++)
    if (chans[i]->id == id) return chans[i];
  return NULL;
}

void chan_free(struct chan *c) {
  for (int i = 0; i < nchans; i++) {
    if (chans[i] != c) continue;
    if (c->job > 0) {
      /* Done, or cancelled: a cut-short one's stage goes, and the sandbox must not stay frozen. */
      kill(c->job, SIGKILL);
      waitpid(c->job, NULL, 0);
      if (c->job_freezes && !c->job_done) vm_freeze(0);
      if (!c->job_done) snapshot_clear_stage();
    }
    if (c->fd >= 0) close(c->fd);
    free(c->pend);
    free(c);
    chans[i] = chans[--nchans];
    return;
  }
}

static void chan_open(uint32_t id) {
  if (chan_of(id) || nchans >= MUX_MAX_CHANNELS) {
    queue(id, MUX_CLOSE, NULL, 0);
    return;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  strcpy(a.sun_path, INIT_SOCKET_PATH);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    vm_log("mux: cannot reach the init: %s", strerror(errno));
    if (fd >= 0) close(fd);
    queue(id, MUX_CLOSE, NULL, 0);
    return;
  }
  fcntl(fd, F_SETFL, O_NONBLOCK);
  struct chan *c = calloc(1, sizeof *c);
  if (!c) vm_die("calloc");
  c->id = id;
  c->fd = fd;
  chans[nchans++] = c;
}

static void chan_flush(struct chan *c) {
  while (c->fd >= 0 && c->pend_len > 0) {
    ssize_t w = write(c->fd, c->pend, c->pend_len);
    if (w < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      close(c->fd);
      c->fd = -1;
      c->pend_len = 0;
      queue(c->id, MUX_CLOSE, NULL, 0);
      return;
    }
    memmove(c->pend, c->pend + w, c->pend_len - (size_t)w);
    c->pend_len -= (size_t)w;
  }
  if (c->fd >= 0 && c->host_eof == 1 && c->pend_len == 0) {
    shutdown(c->fd, SHUT_WR);
    c->host_eof = 2;
  }
}

/* linux/random.h's ioctls (musl ships no kernel headers). */
#define RNDADDENTROPY 0x40085203
#define RNDRESEEDCRNG 0x5207

static void drop_channels(void) {
  while (nchans > 0) chan_free(chans[0]);
}

static uint64_t get64(const char *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

static uint64_t monotonic_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Clock round trips after a restore (MUX_TIME): a round trip this short is good enough; else up to this many. */
#define TIME_GOOD_ROUND_TRIP_NS 20000000u
#define TIME_MAX_ROUND_TRIPS 4
static int time_round_trips;
static uint64_t best_round_trip_ns;

static void ask_time(void) {
  char p[MUX_TIME_PAYLOAD_BYTES];
  uint64_t now = monotonic_ns();
  put32(p, (uint32_t)now);
  put32(p + 4, (uint32_t)(now >> 32));
  queue(0, MUX_TIME, p, sizeof p);
}

/* The host's clock plus half the round trip, kept when its round trip is the shortest yet. */
static void time_is(const char *p, size_t len) {
  if (len != MUX_TIME_IS_PAYLOAD_BYTES) return;
  uint64_t round_trip = monotonic_ns() - get64(p);
  if (round_trip < best_round_trip_ns) {
    best_round_trip_ns = round_trip;
    uint64_t ns = get64(p + 8) * 1000000000u + get32(p + 16) + round_trip / 2;
    struct timespec now = {.tv_sec = (time_t)(ns / 1000000000u), .tv_nsec = (long)(ns % 1000000000u)};
    if (clock_settime(CLOCK_REALTIME, &now) < 0) vm_log("mux: clock_settime: %s", strerror(errno));
  }
  if (best_round_trip_ns > TIME_GOOD_ROUND_TRIP_NS && ++time_round_trips < TIME_MAX_ROUND_TRIPS) ask_time();
}

/* After a restore: the old channels dropped, the wall clock set to the host's (then corrected by round trips), the entropy credited and the kernel's RNG reseeded from it. */
static void restored(const char *p, size_t len) {
  drop_channels();
  /* A VM paused (frozen inside) when it was saved wakes running. */
  if (vm_is_frozen()) vm_freeze(0);
  if (len != MUX_RESTORED_PAYLOAD_BYTES) return;
  struct timespec now = {.tv_sec = (time_t)get64(p), .tv_nsec = (long)get32(p + 8)};
  if (clock_settime(CLOCK_REALTIME, &now) < 0) vm_log("mux: clock_settime: %s", strerror(errno));
  time_round_trips = 0;
  best_round_trip_ns = UINT64_MAX;
  ask_time();
  struct {
    int entropy_count;
    int buf_size;
    char buf[32];
  } pool = {.entropy_count = 256, .buf_size = 32};
  memcpy(pool.buf, p + 12, 32);
  int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
  if (fd < 0 || ioctl(fd, RNDADDENTROPY, &pool) < 0 || ioctl(fd, RNDRESEEDCRNG) < 0) vm_log("mux: reseeding: %s", strerror(errno));
  if (fd >= 0) close(fd);
}

static void from_host(uint32_t id, int kind, const char *p, size_t len) {
  if (kind == MUX_RESTORED) {
    restored(p, len);
    return;
  }
  if (kind == MUX_TIME_IS) {
    time_is(p, len);
    return;
  }
  if (kind == MUX_NET) {
    char status[4];
    put32(status, (uint32_t)vm_net_reconfigure(p, len));
    queue(0, MUX_NET_DONE, status, sizeof status);
    return;
  }
  if (kind == MUX_IDENTITY) {
    char status[4];
    put32(status, (uint32_t)vm_set_identity(p, len));
    queue(0, MUX_IDENTITY_DONE, status, sizeof status);
    return;
  }
  if (kind == MUX_PING) {
    queue(0, MUX_PONG, NULL, 0);
    return;
  }
  if (kind == MUX_OPEN) {
    chan_open(id);
    return;
  }
  if (kind == MUX_SNAPSHOT || kind == MUX_POLICY || kind == MUX_FREEZE) {
    req_open(id, kind);
    return;
  }
  struct chan *c = chan_of(id);
  if (!c) return; /* a channel already gone here: its CLOSE is on the way */
  if (c->req) {
    req_frame(c, kind, p, len);
    return;
  }
  if (kind == MUX_DATA && len > 0 && !c->host_eof) {
    char *n = realloc(c->pend, c->pend_len + len);
    if (!n) vm_die("realloc");
    c->pend = n;
    memcpy(c->pend + c->pend_len, p, len);
    c->pend_len += len;
    chan_flush(c);
  } else if (kind == MUX_EOF) {
    if (!c->host_eof) c->host_eof = 1;
    chan_flush(c);
  } else if (kind == MUX_CLOSE) {
    chan_free(c);
  }
}

static void read_port(int port) {
  ssize_t r = read(port, in + in_len, sizeof in - in_len);
  if (r <= 0) return;
  in_len += (size_t)r;
  size_t off = 0;
  while (in_len - off >= MUX_HEADER_BYTES) {
    uint32_t len = get32(in + off + 8);
    if (len > MUX_MAX_PAYLOAD) vm_die("mux: oversized frame from the host");
    if (in_len - off < MUX_HEADER_BYTES + len) break;
    from_host(get32(in + off), (unsigned char)in[off + 4], in + off + MUX_HEADER_BYTES, len);
    off += MUX_HEADER_BYTES + len;
  }
  memmove(in, in + off, in_len - off);
  in_len -= off;
}

static void read_chan(struct chan *c) {
  static char buf[MUX_MAX_PAYLOAD];
  if (c->job) {
    read_job(c);
    return;
  }
  ssize_t r = read(c->fd, buf, sizeof buf);
  if (r > 0) {
    queue(c->id, MUX_DATA, buf, (size_t)r);
  } else if (r == 0) {
    c->init_eof = 1;
    queue(c->id, MUX_EOF, NULL, 0);
  } else if (errno != EAGAIN && errno != EINTR) {
    queue(c->id, MUX_CLOSE, NULL, 0);
    chan_free(c);
  }
}

/* The host went away: every channel ends, as a dropped connection would. */
static void host_gone(void) {
  drop_channels();
  out_len = out_off = 0;
  in_len = 0;
}

void mux_main(int port, int root_fd) {
  hide_init(root_fd);
  static struct pollfd pfds[1 + MUX_MAX_CHANNELS];
  /* By id, not pointer: handling one channel (or the port) may free another. */
  static uint32_t who[1 + MUX_MAX_CHANNELS];
  for (;;) {
    int n = 0;
    pfds[n++] = (struct pollfd){.fd = port, .events = POLLIN | (out_len > out_off ? POLLOUT : 0)};
    /* Past 1 MiB queued for the host, stop reading the init: it then blocks its commands. */
    if (out_len - out_off < (1u << 20)) {
      for (int i = 0; i < nchans; i++) {
        if (chans[i]->fd < 0 || chans[i]->init_eof) continue;
        who[n] = chans[i]->id;
        pfds[n++] = (struct pollfd){.fd = chans[i]->fd, .events = POLLIN | (chans[i]->pend_len ? POLLOUT : 0)};
      }
    }
    if (poll(pfds, (nfds_t)n, vm_reclaim_timeout_ms()) < 0) {
      if (errno == EINTR) continue;
      vm_die("poll");
    }
    if (pfds[0].revents & POLLHUP) {
      host_gone();
      struct timespec t = {0, 20 * 1000 * 1000};
      nanosleep(&t, NULL);
      continue;
    }
    if (pfds[0].revents & POLLIN) read_port(port);
    for (int j = 1; j < n; j++) {
      struct chan *c = chan_of(who[j]);
      if (!pfds[j].revents || !c || c->fd != pfds[j].fd) continue;
      if (pfds[j].revents & POLLOUT) chan_flush(c);
      c = chan_of(who[j]);
      if (c && c->fd == pfds[j].fd && (pfds[j].revents & (POLLIN | POLLHUP | POLLERR))) read_chan(c);
    }
    /* Channels both sides closed are done. */
    for (int i = nchans - 1; i >= 0; i--) {
      struct chan *c = chans[i];
      if (c->init_eof && c->host_eof == 2) {
        queue(c->id, MUX_CLOSE, NULL, 0);
        chan_free(c);
      }
    }
    while (out_len > out_off) {
      ssize_t w = write(port, out + out_off, out_len - out_off);
      if (w < 0) break; /* EAGAIN: POLLOUT next round */
      out_off += (size_t)w;
    }
    if (out_off == out_len) out_off = out_len = 0;
  }
}
