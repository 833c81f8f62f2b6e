/*
 * Requests to the guest's trusted side itself (vminit.h: MUX_SNAPSHOT, MUX_POLICY,
 * MUX_FREEZE), each on a channel of its own: the body is gathered (capped), then the quick
 * ones (hidden paths, a freeze) run in the multiplexer and answer at once. A snapshot runs
 * in a child (snapshot.c) whose records, tar bytes then its result, come back on a
 * SOCK_SEQPACKET socket that the multiplexer polls like a connection to the init: with the
 * same backpressure towards the host, and cancelled (the child killed) when the host
 * closes the channel. The child is forked from this undumpable process and never execs,
 * so the sandbox can neither read its memory nor take its fds.
 */
#define _GNU_SOURCE
#include "mux.h"
#include <fcntl.h>
#include <sys/socket.h>

/* A request's answer: its status (0 ok, 2 failed) and message, then the channel's end. */
static void answer(struct chan *c, int failed, const char *message) {
  char r[4 + 512];
  size_t m = failed ? strnlen(message, 511) : 0;
  put32(r, failed ? 2 : 0);
  memcpy(r + 4, message, m);
  queue(c->id, MUX_RESULT, r, 4 + m);
  queue(c->id, MUX_CLOSE, NULL, 0);
  chan_free(c);
}

void req_open(uint32_t id, int kind) {
  if (chan_of(id) || nchans >= MUX_MAX_CHANNELS) {
    queue(id, MUX_CLOSE, NULL, 0);
    return;
  }
  struct chan *c = calloc(1, sizeof *c);
  if (!c) vm_die("calloc");
  c->id = id;
  c->fd = -1;
  c->req = kind;
  chans[nchans++] = c;
}

static void start_snapshot(struct chan *c) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
    answer(c, 1, "socketpair");
    return;
  }
  pid_t pid = fork();
  if (pid < 0) {
    close(sv[0]);
    close(sv[1]);
    answer(c, 1, "fork");
    return;
  }
  if (pid == 0) {
    /* Only its socket (and the console): the init's connections and the port stay the multiplexer's. */
    for (int fd = 3; fd < 4096; fd++)
      if (fd != sv[1]) close(fd);
    snapshot_main(sv[1], c->pend, c->pend_len);
  }
  close(sv[1]);
  fcntl(sv[0], F_SETFL, O_NONBLOCK);
  c->job_freezes = c->pend_len >= 4 && get32(c->pend) != SNAP_HELD;
  free(c->pend);
  c->pend = NULL;
  c->pend_len = 0;
  c->fd = sv[0];
  c->job = pid;
  c->req = 0;
  c->host_eof = 2;
}

/* The whole body is here: run the request. */
static void req_run(struct chan *c) {
  char err[512] = "";
  if (c->req == MUX_SNAPSHOT) {
    start_snapshot(c);
    return;
  }
  if (c->req == MUX_POLICY) {
    int failed = hide_apply(c->pend, c->pend_len, err, sizeof err) < 0;
    answer(c, failed, err);
    return;
  }
  int on = c->pend_len > 0 && c->pend[0];
  if (vm_freeze(on) < 0) snprintf(err, sizeof err, "%s the sandbox: %s", on ? "freezing" : "thawing", strerror(errno));
  answer(c, err[0] != 0, err);
}

void req_frame(struct chan *c, int kind, const char *p, size_t len) {
  if (kind == MUX_CLOSE) {
    chan_free(c);
    return;
  }
  if (kind == MUX_EOF) {
    req_run(c);
    return;
  }
  if (kind != MUX_DATA) return;
  if (c->pend_len + len > MUX_MAX_REQUEST_BYTES) {
    answer(c, 1, "the request is too large");
    return;
  }
  char *n = realloc(c->pend, c->pend_len + len);
  if (!n) vm_die("realloc");
  c->pend = n;
  memcpy(c->pend + c->pend_len, p, len);
  c->pend_len += len;
}

/* One record of a snapshot's child: tar bytes, or its result; its end closes the channel. */
void read_job(struct chan *c) {
  static char rec[JOB_RECORD_MAX];
  ssize_t r = recv(c->fd, rec, sizeof rec, 0);
  if (r > 0) {
    if (rec[0] == 'R') c->job_done = 1;
    if (rec[0] == 'D' || rec[0] == 'R') queue(c->id, rec[0] == 'D' ? MUX_DATA : MUX_RESULT, rec + 1, (size_t)r - 1);
    return;
  }
  if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
  queue(c->id, MUX_CLOSE, NULL, 0);
  chan_free(c);
}
