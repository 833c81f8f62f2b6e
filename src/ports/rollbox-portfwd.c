/*
 * rollbox-portfwd: a worker host's doors into TCP ports inside its sandboxes' network
 * namespaces (src/ports: forwarder.ts starts it, relay.ts decides who may pass).
 *
 *   rollbox-portfwd SOCKET_PATH [RELAY_ADDRESS RELAY_PORT CONTROL_PATH]
 *
 * - SOCKET_PATH, a unix socket (mode 0600, in a directory only root reads): each connection
 *   names its target in one line, "NETNS_PID PORT\n", and is answered "ok\n" or
 *   "err ECODE message\n" (forwarder.ts#open).
 * - RELAY_ADDRESS RELAY_PORT (numeric; port 0: any free one): the worker's port relay, the
 *   door gateways dial. Each connection starts with a ticket line. A child forked for it asks
 *   the worker whether the ticket opens a port (CONTROL_PATH, a unix socket relay.ts serves:
 *   the ticket in; "ok NETNS_PID PORT SANDBOX_ID" or "err {code, message}" out), then answers
 *   the gateway "ok\n" and relays, or "err {code, message}\n" and closes. The bytes of port
 *   traffic never pass through the worker's Node process (that hop cost about a third of the
 *   whole way into the sandbox again).
 * Prints "ready RELAY_PORT" (the port bound; 0 without a relay) once it listens.
 *
 * A child forked per connection enters the network namespace of NETNS_PID (a sandbox's
 * init), connects to 127.0.0.1:PORT there (a server bound to 0.0.0.0 or to the sandbox's
 * loopback alike), then copies bytes both ways until both directions ended, passing
 * half-closes on. A socket keeps the namespace it was made in, so nothing else of the child
 * needs the sandbox's view. The listener dies with the worker and a child with the listener
 * (PR_SET_PDEATHSIG), so a worker that stops leaves no connection open; else a child ends
 * with its connection.
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
/* A ticket and the worker's answer to it are short; the worker answers at once. */
#define TICKET_MAX_BYTES 256
#define CONTROL_ANSWER_MAX_BYTES 1024
#define CONTROL_TIMEOUT_S 10

static void write_all(int fd, const char *bytes, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, bytes, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    bytes += n;
    len -= (size_t)n;
  }
}

static void answer(int fd, const char *text) { write_all(fd, text, strlen(text)); }

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
static void relay(int a, int b, const char *pending, size_t pending_len) {
  static struct direction dirs[2];
  dirs[0] = (struct direction){.from = a, .to = b};
  /* What `a` sent before the relay began goes to `b` first, as any read would (so a server
   * that writes before it reads is read from meanwhile). */
  if (pending_len > 0) memcpy(dirs[0].buf, pending, pending_len);
  dirs[0].len = pending_len;
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

/*
 * A connection to 127.0.0.1:PORT in the network namespace of process PID; -1 with errno
 * set (and *what naming the step) when it cannot be made.
 */
static int connect_into(long pid, long port, const char **what) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/ns/net", pid);
  *what = "sandbox network namespace";
  int ns = open(path, O_RDONLY | O_CLOEXEC);
  if (ns < 0) return -1;
  *what = "entering the sandbox network namespace";
  if (setns(ns, CLONE_NEWNET) != 0) return -1;
  close(ns);
  *what = "socket";
  int upstream = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (upstream < 0) return -1;
  struct timeval connect_timeout = {.tv_sec = CONNECT_TIMEOUT_S}, none = {0};
  setsockopt(upstream, SOL_SOCKET, SO_SNDTIMEO, &connect_timeout, sizeof connect_timeout);
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  *what = "connect";
  if (connect(upstream, (struct sockaddr *)&to, sizeof to) != 0) return -1;
  setsockopt(upstream, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
  int one = 1;
  setsockopt(upstream, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return upstream;
}

/* A connection on SOCKET_PATH: "NETNS_PID PORT\n", then the port's bytes. */
static void serve(int client) {
  struct timeval request_timeout = {.tv_sec = REQUEST_TIMEOUT_S}, none = {0};
  setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &request_timeout, sizeof request_timeout);
  long pid, port;
  if (read_request(client, &pid, &port) != 0) {
    answer(client, "err EINVAL malformed request: want \"NETNS_PID PORT\"\n");
    return;
  }
  setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
  const char *what;
  int upstream = connect_into(pid, port, &what);
  if (upstream < 0) { fail(client, errno, what); return; }
  answer(client, "ok\n");
  relay(client, upstream, NULL, 0);
}

static void refuse(int client, const char *code, const char *message) {
  char line[512];
  snprintf(line, sizeof line, "err {\"code\":\"%s\",\"message\":\"%s\"}\n", code, message);
  answer(client, line);
}

/* A connection to the worker's control socket; -1 if it cannot be made. */
static int connect_control(const char *control_path) {
  int control = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (control < 0) return -1;
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  strncpy(addr.sun_path, control_path, sizeof addr.sun_path - 1);
  if (connect(control, (struct sockaddr *)&addr, sizeof addr) != 0) {
    close(control);
    return -1;
  }
  return control;
}

/*
 * Asks the worker, over `control` (a connection to its control socket made before this
 * connection came), what TICKET opens. Fills `answer_line` with its one-line answer
 * (without the newline); -1 if it could not be asked or did not answer.
 */
static int ask_worker(int control, const char *ticket, char *answer_line, size_t max) {
  if (control < 0) return -1;
  struct timeval timeout = {.tv_sec = CONTROL_TIMEOUT_S};
  setsockopt(control, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  write_all(control, ticket, strlen(ticket));
  write_all(control, "\n", 1);
  size_t len = 0;
  for (;;) {
    if (len + 1 >= max) return -1;
    ssize_t n = read(control, answer_line + len, max - 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    len += (size_t)n;
    char *newline = memchr(answer_line, '\n', len);
    if (newline) {
      *newline = 0;
      return 0;
    }
  }
}

/*
 * A connection on the relay's TCP port: a ticket line, then the port's bytes. What came
 * behind the ticket in the same reads (a gateway sends its request at once, without waiting
 * for "ok") is sent on first.
 */
static void serve_relay(int client, int control) {
  int one = 1;
  setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct timeval ticket_timeout = {.tv_sec = REQUEST_TIMEOUT_S}, none = {0};
  setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &ticket_timeout, sizeof ticket_timeout);
  static char held[BUF_BYTES];
  size_t len = 0;
  char *newline = NULL;
  while (!newline && len <= TICKET_MAX_BYTES) {
    ssize_t n = read(client, held + len, sizeof held - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) { refuse(client, "invalid_request", "port relay: no ticket within 5000 ms"); return; }
    if (n == 0) return;
    newline = memchr(held + len, '\n', (size_t)n);
    len += (size_t)n;
  }
  if (!newline || (size_t)(newline - held) > TICKET_MAX_BYTES) { refuse(client, "invalid_request", "port relay: line longer than 256 bytes"); return; }
  setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
  *newline = 0;
  char verdict[CONTROL_ANSWER_MAX_BYTES];
  if (ask_worker(control, held, verdict, sizeof verdict) != 0) {
    refuse(client, "unavailable", "port relay: the worker host did not answer for its sandboxes");
    return;
  }
  if (strncmp(verdict, "ok ", 3) != 0) {
    answer(client, verdict);
    answer(client, "\n");
    return;
  }
  long pid, port;
  char sandbox[64];
  if (sscanf(verdict + 3, "%ld %ld %63[a-z0-9_]", &pid, &port, sandbox) != 3) {
    refuse(client, "internal", "port relay: unexpected answer from the worker host");
    return;
  }
  const char *what;
  int upstream = connect_into(pid, port, &what);
  if (upstream < 0) {
    char message[256];
    int err = errno;
    if (err == ECONNREFUSED) {
      snprintf(message, sizeof message, "nothing listens on port %ld in sandbox %s (a server there must listen on 0.0.0.0 or 127.0.0.1)", port, sandbox);
      refuse(client, "port_closed", message);
    } else if (err == ENOENT || err == ESRCH) {
      snprintf(message, sizeof message, "sandbox %s is not running on this worker host", sandbox);
      refuse(client, "invalid_state", message);
    } else if (err == ETIMEDOUT || err == EAGAIN || err == EINPROGRESS) {
      snprintf(message, sizeof message, "connecting to port %ld in sandbox %s timed out (is it paused?)", port, sandbox);
      refuse(client, "timeout", message);
    } else {
      snprintf(message, sizeof message, "connecting to port %ld in sandbox %s: %s: %s", port, sandbox, what, strerror(err));
      refuse(client, "internal", message);
    }
    return;
  }
  answer(client, "ok\n");
  relay(client, upstream, newline + 1, len - (size_t)(newline + 1 - held));
}

static int listen_unix(const char *path) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof addr.sun_path) {
    fprintf(stderr, "rollbox-portfwd: socket path too long\n");
    return -1;
  }
  strcpy(addr.sun_path, path);
  int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  unlink(path);
  umask(077);
  if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(listener, 512) != 0) {
    perror("rollbox-portfwd: listen on its unix socket");
    return -1;
  }
  return listener;
}

/* Listens on a numeric IPv4 or IPv6 address (IPv6 ones take IPv4 too, as Node's do); fills *bound with the port. */
static int listen_tcp(const char *address, const char *port_text, int *bound) {
  struct sockaddr_storage addr = {0};
  socklen_t addr_len;
  int family;
  long port = strtol(port_text, NULL, 10);
  struct sockaddr_in *v4 = (struct sockaddr_in *)&addr;
  struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&addr;
  if (inet_pton(AF_INET, address, &v4->sin_addr) == 1) {
    family = v4->sin_family = AF_INET;
    v4->sin_port = htons((unsigned short)port);
    addr_len = sizeof *v4;
  } else if (inet_pton(AF_INET6, address, &v6->sin6_addr) == 1) {
    family = v6->sin6_family = AF_INET6;
    v6->sin6_port = htons((unsigned short)port);
    addr_len = sizeof *v6;
  } else {
    fprintf(stderr, "rollbox-portfwd: %s is not a numeric address\n", address);
    return -1;
  }
  int listener = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1, zero = 0;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (family == AF_INET6) setsockopt(listener, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  if (listener < 0 || bind(listener, (struct sockaddr *)&addr, addr_len) != 0 || listen(listener, 1024) != 0) {
    fprintf(stderr, "rollbox-portfwd: listen on %s:%s: %s\n", address, port_text, strerror(errno));
    return -1;
  }
  getsockname(listener, (struct sockaddr *)&addr, &addr_len);
  *bound = ntohs(family == AF_INET ? v4->sin_port : v6->sin6_port);
  return listener;
}

/*
 * Connections to the worker's control socket made ahead, one for each relay connection to
 * come: the worker's accept then happens off the path of a connection (it cost a third of
 * the relay's time). Polled: one the worker closed is dropped.
 */
#define SPARES 16
static int spares[SPARES];
static int spare_count;

static void refill_spares(const char *control_path) {
  while (spare_count < SPARES) {
    int control = connect_control(control_path);
    if (control < 0) return;
    spares[spare_count++] = control;
  }
}

static int take_spare(const char *control_path) {
  return spare_count > 0 ? spares[--spare_count] : connect_control(control_path);
}

int main(int argc, char **argv) {
  if (argc != 2 && argc != 5) {
    fprintf(stderr, "usage: rollbox-portfwd SOCKET_PATH [RELAY_ADDRESS RELAY_PORT CONTROL_PATH]\n");
    return 2;
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  pid_t listener_pid = getpid();
  if (getppid() == 1) return 1; /* the worker is already gone */
  signal(SIGCHLD, SIG_IGN);     /* children are reaped by the kernel */
  signal(SIGPIPE, SIG_IGN);
  const char *control_path = argc == 5 ? argv[4] : NULL;
  int bound = 0;
  int unix_listener = listen_unix(argv[1]);
  if (unix_listener < 0) return 1;
  int relay_listener = -1;
  if (control_path && (relay_listener = listen_tcp(argv[2], argv[3], &bound)) < 0) return 1;
  if (control_path) refill_spares(control_path);
  printf("ready %d\n", bound);
  fflush(stdout);
  for (;;) {
    struct pollfd fds[2 + SPARES] = {{.fd = unix_listener, .events = POLLIN}, {.fd = relay_listener, .events = POLLIN}};
    int watched = spare_count;
    for (int i = 0; i < watched; i++) fds[2 + i] = (struct pollfd){.fd = spares[i], .events = POLLIN};
    if (poll(fds, 2 + (nfds_t)watched, -1) < 0) {
      if (errno == EINTR) continue;
      perror("rollbox-portfwd: poll");
      return 1;
    }
    /* A spare the worker closed (or wrote to) is of no use: dropped, made again below. */
    for (int i = watched - 1; i >= 0; i--) {
      if (!fds[2 + i].revents) continue;
      close(spares[i]);
      spares[i] = spares[--spare_count];
    }
    for (int i = 0; i < 2; i++) {
      if (!(fds[i].revents & POLLIN)) continue;
      int client = accept4(fds[i].fd, NULL, NULL, SOCK_CLOEXEC);
      if (client < 0) {
        if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
        if (errno == EMFILE || errno == ENFILE) {
          usleep(10000);
          continue;
        }
        perror("rollbox-portfwd: accept");
        return 1;
      }
      int control = i == 1 ? take_spare(control_path) : -1;
      pid_t child = fork();
      if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != listener_pid) _exit(0); /* the listener died before the line above */
        close(unix_listener);
        if (relay_listener >= 0) close(relay_listener);
        for (int k = 0; k < spare_count; k++) close(spares[k]);
        if (i == 0) serve(client);
        else serve_relay(client, control);
        _exit(0);
      }
      close(client);
      if (control >= 0) close(control);
    }
    if (control_path) refill_spares(control_path);
  }
}
