/*
 * rollbox-portfwd: opens TCP connections to ports inside sandboxes' network namespaces,
 * for the worker host's port relay (src/ports/forwarder.ts).
 *
 *   rollbox-portfwd SOCKET_PATH
 *
 * Listens on a unix socket at SOCKET_PATH (mode 0600, in a directory only root reads) and
 * prints "ready" once it does. Each connection names its target in one line,
 * "NETNS_PID PORT\n". A child forked for it enters the network namespace of NETNS_PID (a
 * sandbox's init), connects to 127.0.0.1:PORT there (a server bound to 0.0.0.0 or to the
 * sandbox's loopback alike), answers "ok\n" or "err ECODE message\n", then copies bytes
 * both ways until both directions ended, passing half-closes on. A socket keeps the
 * namespace it was made in, so nothing else of the child needs the sandbox's view.
 * The listener dies with the worker (PR_SET_PDEATHSIG); a child ends with its connection.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define BUF_BYTES 65536
#define CONNECT_TIMEOUT_S 5
#define REQUEST_TIMEOUT_S 5

static void answer(int fd, const char *text) {
  size_t len = strlen(text);
  while (len > 0) {
    ssize_t n = write(fd, text, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text += n;
    len -= (size_t)n;
  }
}

static void fail(int fd, int err, const char *what) {
  char line[256];
  const char *code = err == ECONNREFUSED ? "ECONNREFUSED" : err == ETIMEDOUT || err == EAGAIN || err == EINPROGRESS ? "ETIMEDOUT" : err == ENOENT || err == ESRCH ? "ENOENT" : "EIO";
  snprintf(line, sizeof line, "err %s %s: %s\n", code, what, strerror(err));
  answer(fd, line);
}

/* The request line, read byte by byte so nothing past it is taken from the stream. */
static int read_request(int fd, long *pid, long *port) {
  char line[64];
  size_t len = 0;
  for (;;) {
    if (len + 1 >= sizeof line) return -1;
    ssize_t n = read(fd, line + len, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    if (line[len] == '\n') break;
    len++;
  }
  line[len] = 0;
  char *end;
  *pid = strtol(line, &end, 10);
  if (end == line || *end != ' ' || *pid <= 0) return -1;
  char *p = end + 1;
  *port = strtol(p, &end, 10);
  if (end == p || *end != 0 || *port < 1 || *port > 65535) return -1;
  return 0;
}

struct direction {
  int from, to;
  char buf[BUF_BYTES];
  size_t len, off;
  int eof; /* `from` ended: `to` was (or will be, once the buffer is written) shut for writing */
  int done;
};

/* Both directions, non-blocking: one side that stops reading never stalls the other. */
static void relay(int a, int b) {
  static struct direction dirs[2];
  dirs[0] = (struct direction){.from = a, .to = b};
  dirs[1] = (struct direction){.from = b, .to = a};
  fcntl(a, F_SETFL, fcntl(a, F_GETFL) | O_NONBLOCK);
  fcntl(b, F_SETFL, fcntl(b, F_GETFL) | O_NONBLOCK);
  while (!(dirs[0].done && dirs[1].done)) {
    struct pollfd fds[2] = {{.fd = a}, {.fd = b}};
    for (int i = 0; i < 2; i++) {
      struct direction *d = &dirs[i];
      if (d->done) continue;
      struct pollfd *in = d->from == a ? &fds[0] : &fds[1];
      struct pollfd *out = d->to == a ? &fds[0] : &fds[1];
      if (d->len > d->off) out->events |= POLLOUT;
      else if (!d->eof) in->events |= POLLIN;
    }
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    for (int i = 0; i < 2; i++) {
      struct direction *d = &dirs[i];
      if (d->done) continue;
      if (d->len > d->off) {
        ssize_t n = write(d->to, d->buf + d->off, d->len - d->off);
        if (n < 0 && errno != EAGAIN && errno != EINTR) return;
        if (n > 0) d->off += (size_t)n;
        if (d->off == d->len) d->off = d->len = 0;
      } else if (!d->eof) {
        ssize_t n = read(d->from, d->buf, BUF_BYTES);
        if (n < 0 && errno != EAGAIN && errno != EINTR) return;
        if (n == 0) d->eof = 1;
        if (n > 0) d->len = (size_t)n;
      }
      if (d->eof && d->len == d->off) {
        shutdown(d->to, SHUT_WR);
        d->done = 1;
      }
    }
  }
}

static void serve(int client) {
  struct timeval request_timeout = {.tv_sec = REQUEST_TIMEOUT_S};
  setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &request_timeout, sizeof request_timeout);
  long pid, port;
  if (read_request(client, &pid, &port) != 0) {
    answer(client, "err EINVAL malformed request: want \"NETNS_PID PORT\"\n");
    return;
  }
  struct timeval none = {0};
  setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/ns/net", pid);
  int ns = open(path, O_RDONLY | O_CLOEXEC);
  if (ns < 0) { fail(client, errno, "sandbox network namespace"); return; }
  if (setns(ns, CLONE_NEWNET) != 0) { fail(client, errno, "entering the sandbox network namespace"); return; }
  close(ns);
  int upstream = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (upstream < 0) { fail(client, errno, "socket"); return; }
  struct timeval connect_timeout = {.tv_sec = CONNECT_TIMEOUT_S};
  setsockopt(upstream, SOL_SOCKET, SO_SNDTIMEO, &connect_timeout, sizeof connect_timeout);
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(upstream, (struct sockaddr *)&to, sizeof to) != 0) { fail(client, errno, "connect"); return; }
  setsockopt(upstream, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
  int one = 1;
  setsockopt(upstream, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  answer(client, "ok\n");
  relay(client, upstream);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: rollbox-portfwd SOCKET_PATH\n");
    return 2;
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) return 1; /* the worker is already gone */
  signal(SIGCHLD, SIG_IGN);     /* children are reaped by the kernel */
  signal(SIGPIPE, SIG_IGN);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(argv[1]) >= sizeof addr.sun_path) {
    fprintf(stderr, "rollbox-portfwd: socket path too long\n");
    return 2;
  }
  strcpy(addr.sun_path, argv[1]);
  int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  unlink(argv[1]);
  umask(077);
  if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(listener, 512) != 0) {
    perror("rollbox-portfwd: listen");
    return 1;
  }
  printf("ready\n");
  fflush(stdout);
  for (;;) {
    int client = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    if (client < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        usleep(10000);
        continue;
      }
      perror("rollbox-portfwd: accept");
      return 1;
    }
    pid_t child = fork();
    if (child == 0) {
      close(listener);
      serve(client);
      _exit(0);
    }
    close(client);
  }
}
