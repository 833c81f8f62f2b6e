/*
 * rollbox-init: PID 1 of every rollbox sandbox.
 *
 * runc starts it with the container's full config (namespaces, cgroups, seccomp filter,
 * capabilities, no_new_privs, rlimits), so every command it forks inherits exactly those.
 * It reaps every process re-parented to it, and runs commands for the worker host that
 * reaches it over a private channel:
 *
 *   fd 3  a listening AF_UNIX stream socket the worker bound to a host path that is never
 *         mounted into the container (runc --preserve-fds). Nothing inside the sandbox can
 *         connect to it: the path does not exist in the sandbox's mount namespace, and the
 *         socket lives in the host's network namespace.
 *   fd 4..6  directories of the sandbox's own pids, freezer and memory cgroups. A command
 *         joins its exec cgroup (<dir>/<slot>/cgroup.procs) itself, after fork and before
 *         exec, so the worker can kill its whole tree (setsid and double forks included)
 *         and attribute OOM kills to it.
 *
 * The init makes itself non-dumpable first: /proc/1/{mem,environ,fd,...}, ptrace and
 * pidfd_getfd then need CAP_SYS_PTRACE, which sandboxes never have. Signals from inside
 * its PID namespace never reach it (it installs no handler; SIGCHLD is blocked and read
 * through a signalfd, and a forged SIGCHLD only makes it call waitpid). Exit statuses
 * come from its own waitpid, so code in the sandbox cannot forge a result.
 *
 * One connection carries one command. Frames both ways: an 8-byte header (u8 type,
 * 3 bytes zero, u32 little-endian payload length) and the payload.
 *   worker -> init: SPAWN, STDIN (bytes), STDIN_EOF, PING
 *   init -> worker: STARTED (u32 pid), STDOUT, STDERR (bytes), TRUNCATED (u8 stream),
 *                   EXIT (i32 exit code, i32 raw wait status), ERROR (text), PONG (text)
 * After EXIT the init stops writing and waits for the worker to close the connection.
 * A connection that closes before EXIT kills the command's process group.
 *
 * Static, no libc of the image's, no shell: it works in any base image.
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
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_close_range
#define SYS_close_range 436
#endif

#define INIT_VERSION "rollbox-init 1"

enum {
  F_SPAWN = 1,
  F_STDIN = 2,
  F_STDIN_EOF = 3,
  F_PING = 4,
  F_STARTED = 16,
  F_STDOUT = 17,
  F_STDERR = 18,
  F_TRUNCATED = 19,
  F_EXIT = 20,
  F_ERROR = 21,
  F_PONG = 22,
};

enum { SPAWN_HAS_STDIN = 1 };

#define LISTEN_FD 3
#define CGROUP_FD_FIRST 4
#define CGROUP_FDS 3
#define HEADER_BYTES 8
#define MAX_FRAME_BYTES (16u << 20)
#define MAX_SESSIONS 1024
#define READ_CHUNK 65536
/* Past this many bytes queued for the worker, stop reading the command's output: the
 * command blocks on its pipe instead of the init's memory growing. */
#define OUT_HIGH_WATER (256u << 10)
/* Past this many bytes of stdin not yet taken by the command, stop reading the socket. */
#define IN_HIGH_WATER (256u << 10)

struct buf {
  char *data;
  size_t len, off, cap;
};

struct session {
  int sock;
  struct buf in;     /* frames from the worker, not yet parsed */
  struct buf out;    /* frames to the worker, not yet sent */
  struct buf stdin_; /* stdin bytes not yet written to the command */
  int spawned, stdin_eof, peer_gone, exit_sent, shut;
  pid_t pid;
  int exited, status;
  int fd_out, fd_err, fd_in;
  uint64_t cap[2], seen[2];
  int truncated[2];
};

static struct session *sessions[MAX_SESSIONS];
static int nsessions;
static int cgroup_fds[CGROUP_FDS] = {-1, -1, -1};
extern char **environ;

static void die(const char *what) {
  dprintf(2, "rollbox-init: %s: %s\n", what, strerror(errno));
  _exit(2);
}

static int buf_reserve(struct buf *b, size_t extra) {
  if (b->off > 0 && b->off == b->len) b->off = b->len = 0;
  if (b->len + extra <= b->cap) return 0;
  if (b->off > 0) {
    memmove(b->data, b->data + b->off, b->len - b->off);
    b->len -= b->off;
    b->off = 0;
    if (b->len + extra <= b->cap) return 0;
  }
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->len + extra) cap *= 2;
  char *p = realloc(b->data, cap);
  if (!p) return -1;
  b->data = p;
  b->cap = cap;
  return 0;
}

static size_t buf_pending(const struct buf *b) { return b->len - b->off; }

static void buf_free(struct buf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

static void put_u32(char *p, uint32_t v) {
  p[0] = (char)(v & 0xff);
  p[1] = (char)((v >> 8) & 0xff);
  p[2] = (char)((v >> 16) & 0xff);
  p[3] = (char)((v >> 24) & 0xff);
}

static uint32_t get_u32(const char *p) {
  const unsigned char *u = (const unsigned char *)p;
  return (uint32_t)u[0] | ((uint32_t)u[1] << 8) | ((uint32_t)u[2] << 16) | ((uint32_t)u[3] << 24);
}

/* Queues a frame for the worker; a session that cannot queue is dropped. */
static int send_frame(struct session *s, int type, const void *payload, size_t len) {
  if (s->peer_gone) return 0;
  if (buf_reserve(&s->out, HEADER_BYTES + len) < 0) return -1;
  char *p = s->out.data + s->out.len;
  memset(p, 0, HEADER_BYTES);
  p[0] = (char)type;
  put_u32(p + 4, (uint32_t)len);
  if (len) memcpy(p + HEADER_BYTES, payload, len);
  s->out.len += HEADER_BYTES + len;
  return 0;
}

static void send_error(struct session *s, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if ((size_t)n >= sizeof msg) n = sizeof msg - 1;
  send_frame(s, F_ERROR, msg, (size_t)n);
}

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static void session_free(int i) {
  struct session *s = sessions[i];
  close_fd(&s->sock);
  close_fd(&s->fd_out);
  close_fd(&s->fd_err);
  close_fd(&s->fd_in);
  buf_free(&s->in);
  buf_free(&s->out);
  buf_free(&s->stdin_);
  free(s);
  sessions[i] = sessions[--nsessions];
}

/* Child side of a spawn: everything here runs between fork and exec. */
struct spawn_req {
  uint32_t flags;
  uint32_t cap_out, cap_err;
  int32_t oom_score_adj;
  const char *slot, *cwd;
  char **argv;
  char **envp;
};

static void child_fail(int code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (n > 0) {
    if ((size_t)n >= sizeof msg) n = sizeof msg - 1;
    ssize_t w = write(2, msg, (size_t)n);
    (void)w;
  }
  _exit(code);
}

static void child_run(const struct spawn_req *r, int in_fd, int out_fd, int err_fd) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGPIPE, SIG_DFL);
  if (dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0) _exit(255);
  if (in_fd >= 0) {
    if (dup2(in_fd, 0) < 0) _exit(255);
  } else {
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null < 0 || dup2(null, 0) < 0) child_fail(255, "rollbox: cannot start command: /dev/null: %s\n", strerror(errno));
  }
  /* The exec cgroup first: from here on, the worker can kill everything this becomes. */
  if (r->slot[0]) {
    for (int i = 0; i < CGROUP_FDS; i++) {
      if (cgroup_fds[i] < 0) continue;
      char rel[300];
      snprintf(rel, sizeof rel, "%s/cgroup.procs", r->slot);
      int fd = openat(cgroup_fds[i], rel, O_WRONLY | O_CLOEXEC);
      if (fd < 0 || write(fd, "0", 1) != 1) child_fail(255, "rollbox: cannot start command: joining exec cgroup %s: %s\n", r->slot, strerror(errno));
      close(fd);
    }
  }
  int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom >= 0) {
    char v[16];
    int n = snprintf(v, sizeof v, "%d", r->oom_score_adj);
    ssize_t w = write(oom, v, (size_t)n);
    (void)w;
    close(oom);
  }
  /* Its own session and process group: `kill 0` stays inside this command. */
  setsid();
  /* Nothing of the init reaches the command: no socket, no cgroup directory. Closed
   * before chdir, so a cwd through /proc/self/fd/N finds nothing to climb out of. */
  if (syscall(SYS_close_range, 3u, ~0u, 0u) < 0) {
    for (int fd = 3; fd < 1024; fd++) close(fd);
  }
  if (chdir(r->cwd) < 0) child_fail(255, "rollbox: cannot start command: chdir to cwd (\"%s\"): %s\n", r->cwd, strerror(errno));
  environ = r->envp;
  execvp(r->argv[0], r->argv);
  int e = errno;
  if (e == ENOENT && !strchr(r->argv[0], '/'))
    child_fail(127, "rollbox: cannot start command: exec: \"%s\": executable file not found in $PATH\n", r->argv[0]);
  if (e == ENOENT) child_fail(127, "rollbox: cannot start command: exec: \"%s\": no such file or directory\n", r->argv[0]);
  if (e == EACCES || e == ENOEXEC || e == EISDIR || e == EPERM)
    child_fail(126, "rollbox: cannot start command: exec: \"%s\": %s\n", r->argv[0], strerror(e));
  child_fail(255, "rollbox: cannot start command: exec: \"%s\": %s\n", r->argv[0], strerror(e));
}

/* Reads a NUL-terminated string at *p within [*p, end). */
static const char *take_str(const char **p, const char *end) {
  const char *s = *p;
  const char *nul = memchr(s, 0, (size_t)(end - s));
  if (!nul) return NULL;
  *p = nul + 1;
  return s;
}

/* The command's environment: the init's own (the sandbox's env from its config), with
 * the request's entries replacing those of the same name. */
static char **merge_env(char **req, uint32_t nreq) {
  size_t nbase = 0;
  while (environ[nbase]) nbase++;
  char **out = calloc(nbase + nreq + 1, sizeof *out);
  if (!out) return NULL;
  size_t n = 0;
  for (size_t i = 0; i < nbase; i++) {
    const char *eq = strchr(environ[i], '=');
    size_t klen = eq ? (size_t)(eq - environ[i]) : strlen(environ[i]);
    int overridden = 0;
    for (uint32_t j = 0; j < nreq && !overridden; j++) overridden = strncmp(req[j], environ[i], klen) == 0 && req[j][klen] == '=';
    if (!overridden) out[n++] = environ[i];
  }
  for (uint32_t j = 0; j < nreq; j++) out[n++] = req[j];
  out[n] = NULL;
  return out;
}

static void do_spawn(struct session *s, const char *p, size_t len) {
  const char *end = p + len;
  if (s->spawned) {
    send_error(s, "one command per connection");
    return;
  }
  s->spawned = 1;
  if (len < 24) {
    send_error(s, "spawn frame too short");
    return;
  }
  struct spawn_req r;
  r.flags = get_u32(p);
  r.cap_out = get_u32(p + 4);
  r.cap_err = get_u32(p + 8);
  r.oom_score_adj = (int32_t)get_u32(p + 12);
  uint32_t argc = get_u32(p + 16), envc = get_u32(p + 20);
  p += 24;
  if (argc == 0 || argc > len || envc > len) {
    send_error(s, "bad argument counts");
    return;
  }
  r.slot = take_str(&p, end);
  r.cwd = r.slot ? take_str(&p, end) : NULL;
  char **argv = calloc(argc + 1, sizeof *argv);
  char **envreq = calloc(envc + 1, sizeof *envreq);
  int ok = r.cwd && argv && envreq && !strchr(r.slot, '/') && strcmp(r.slot, "..") != 0 && strcmp(r.slot, ".") != 0;
  for (uint32_t i = 0; ok && i < argc; i++) ok = (argv[i] = (char *)take_str(&p, end)) != NULL;
  for (uint32_t i = 0; ok && i < envc; i++) ok = (envreq[i] = (char *)take_str(&p, end)) != NULL && strchr(envreq[i], '=') != NULL;
  r.argv = argv;
  r.envp = ok ? merge_env(envreq, envc) : NULL;
  if (!ok || !r.envp) {
    send_error(s, "malformed spawn frame");
    free(argv);
    free(envreq);
    free(r.envp);
    return;
  }
  int out[2] = {-1, -1}, err[2] = {-1, -1}, in[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 || ((r.flags & SPAWN_HAS_STDIN) && pipe2(in, O_CLOEXEC) < 0)) {
    send_error(s, "pipe: %s", strerror(errno));
    goto fail;
  }
  pid_t pid = fork();
  if (pid < 0) {
    send_error(s, "fork: %s", strerror(errno));
    goto fail;
  }
  if (pid == 0) child_run(&r, in[0], out[1], err[1]);
  close(out[1]);
  close(err[1]);
  if (in[0] >= 0) close(in[0]);
  s->pid = pid;
  s->fd_out = out[0];
  s->fd_err = err[0];
  s->fd_in = in[1];
  fcntl(s->fd_out, F_SETFL, O_NONBLOCK);
  fcntl(s->fd_err, F_SETFL, O_NONBLOCK);
  if (s->fd_in >= 0) fcntl(s->fd_in, F_SETFL, O_NONBLOCK);
  s->cap[0] = r.cap_out;
  s->cap[1] = r.cap_err;
  char started[4];
  put_u32(started, (uint32_t)pid);
  send_frame(s, F_STARTED, started, 4);
  free(argv);
  free(envreq);
  free(r.envp);
  return;
fail:
  for (int i = 0; i < 2; i++) {
    if (out[i] >= 0) close(out[i]);
    if (err[i] >= 0) close(err[i]);
    if (in[i] >= 0) close(in[i]);
  }
  free(argv);
  free(envreq);
  free(r.envp);
}

static void kill_command(struct session *s) {
  if (s->pid > 0 && !s->exited) {
    kill(-s->pid, SIGKILL);
    kill(s->pid, SIGKILL);
  }
}

/* Parses complete frames from the worker. */
static void handle_input(struct session *s) {
  while (buf_pending(&s->in) >= HEADER_BYTES) {
    const char *h = s->in.data + s->in.off;
    uint32_t len = get_u32(h + 4);
    if (len > MAX_FRAME_BYTES) {
      send_error(s, "frame too large");
      s->peer_gone = 1;
      return;
    }
    if (buf_pending(&s->in) < HEADER_BYTES + len) return;
    const char *payload = h + HEADER_BYTES;
    switch ((unsigned char)h[0]) {
      case F_SPAWN:
        do_spawn(s, payload, len);
        break;
      case F_STDIN:
        if (s->fd_in >= 0 && !s->stdin_eof && buf_reserve(&s->stdin_, len) == 0) {
          memcpy(s->stdin_.data + s->stdin_.len, payload, len);
          s->stdin_.len += len;
        }
        break;
      case F_STDIN_EOF:
        s->stdin_eof = 1;
        break;
      case F_PING: {
        char pong[64];
        int n = snprintf(pong, sizeof pong, "%s pid=%d", INIT_VERSION, (int)getpid());
        send_frame(s, F_PONG, pong, (size_t)n);
        break;
      }
      default:
        send_error(s, "unknown frame type %d", (unsigned char)h[0]);
        break;
    }
    s->in.off += HEADER_BYTES + len;
  }
}

/* Output of stream k (0 stdout, 1 stderr): forwarded up to its cap, the rest drained and dropped. */
static void read_output(struct session *s, int k) {
  int *fd = k == 0 ? &s->fd_out : &s->fd_err;
  char chunk[READ_CHUNK];
  ssize_t n = read(*fd, chunk, sizeof chunk);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    close_fd(fd);
    return;
  }
  uint64_t room = s->seen[k] < s->cap[k] ? s->cap[k] - s->seen[k] : 0;
  size_t keep = (uint64_t)n < room ? (size_t)n : (size_t)room;
  s->seen[k] += (uint64_t)n;
  if (keep > 0) send_frame(s, k == 0 ? F_STDOUT : F_STDERR, chunk, keep);
  if (keep < (size_t)n && !s->truncated[k]) {
    s->truncated[k] = 1;
    char which = (char)k;
    send_frame(s, F_TRUNCATED, &which, 1);
  }
}

static void write_stdin(struct session *s) {
  while (buf_pending(&s->stdin_) > 0) {
    ssize_t n = write(s->fd_in, s->stdin_.data + s->stdin_.off, buf_pending(&s->stdin_));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) { /* EPIPE: the command closed its stdin; the rest is dropped */
      close_fd(&s->fd_in);
      buf_free(&s->stdin_);
      return;
    }
    s->stdin_.off += (size_t)n;
  }
}

static void reap(void) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (int i = 0; i < nsessions; i++) {
      if (sessions[i]->pid == pid && !sessions[i]->exited) {
        sessions[i]->exited = 1;
        sessions[i]->status = status;
      }
    }
  }
}

static void finish_if_done(struct session *s) {
  if (s->exit_sent || !s->exited || s->fd_out >= 0 || s->fd_err >= 0) return;
  int code = WIFEXITED(s->status) ? WEXITSTATUS(s->status) : WIFSIGNALED(s->status) ? 128 + WTERMSIG(s->status) : 255;
  char payload[8];
  put_u32(payload, (uint32_t)code);
  put_u32(payload + 4, (uint32_t)s->status);
  send_frame(s, F_EXIT, payload, 8);
  s->exit_sent = 1;
  close_fd(&s->fd_in);
}

static void flush_out(struct session *s) {
  while (buf_pending(&s->out) > 0) {
    ssize_t n = send(s->sock, s->out.data + s->out.off, buf_pending(&s->out), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {
      s->peer_gone = 1;
      buf_free(&s->out);
      return;
    }
    s->out.off += (size_t)n;
  }
}

static void setup_fds(void) {
  int listening = 0;
  socklen_t len = sizeof listening;
  if (getsockopt(LISTEN_FD, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) < 0 || !listening) {
    errno = EBADF;
    die("fd 3 is not a listening socket");
  }
  fcntl(LISTEN_FD, F_SETFD, FD_CLOEXEC);
  fcntl(LISTEN_FD, F_SETFL, O_NONBLOCK);
  for (int i = 0; i < CGROUP_FDS; i++) {
    struct stat st;
    int fd = CGROUP_FD_FIRST + i;
    if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
      fcntl(fd, F_SETFD, FD_CLOEXEC);
      cgroup_fds[i] = fd;
    }
  }
  /* Anything else runc handed over is not ours to keep. */
  if (syscall(SYS_close_range, (unsigned)(CGROUP_FD_FIRST + CGROUP_FDS), ~0u, 0u) < 0) {
    for (int fd = CGROUP_FD_FIRST + CGROUP_FDS; fd < 1024; fd++) close(fd);
  }
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) die("prctl(PR_SET_DUMPABLE)");
  setup_fds();
  signal(SIGPIPE, SIG_IGN);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  if (sigprocmask(SIG_BLOCK, &chld, NULL) < 0) die("sigprocmask");
  int sfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sfd < 0) die("signalfd");

  /* Per session at most: socket, stdout, stderr, stdin. */
  static struct pollfd pfds[2 + MAX_SESSIONS * 4];
  static struct {
    int session, what;
  } who[2 + MAX_SESSIONS * 4];
  for (;;) {
    int n = 0;
    pfds[n] = (struct pollfd){.fd = sfd, .events = POLLIN};
    who[n++].session = -1;
    if (nsessions < MAX_SESSIONS) {
      pfds[n] = (struct pollfd){.fd = LISTEN_FD, .events = POLLIN};
      who[n++].session = -2;
    }
    for (int i = 0; i < nsessions; i++) {
      struct session *s = sessions[i];
      int out_ok = buf_pending(&s->out) < OUT_HIGH_WATER;
      short sock_events = 0;
      if (!s->peer_gone && buf_pending(&s->stdin_) < IN_HIGH_WATER) sock_events |= POLLIN;
      if (buf_pending(&s->out) > 0) sock_events |= POLLOUT;
      pfds[n] = (struct pollfd){.fd = s->sock, .events = sock_events};
      who[n].session = i;
      who[n++].what = 0;
      if (s->fd_out >= 0 && out_ok) {
        pfds[n] = (struct pollfd){.fd = s->fd_out, .events = POLLIN};
        who[n].session = i;
        who[n++].what = 1;
      }
      if (s->fd_err >= 0 && out_ok) {
        pfds[n] = (struct pollfd){.fd = s->fd_err, .events = POLLIN};
        who[n].session = i;
        who[n++].what = 2;
      }
      if (s->fd_in >= 0 && buf_pending(&s->stdin_) > 0) {
        pfds[n] = (struct pollfd){.fd = s->fd_in, .events = POLLOUT};
        who[n].session = i;
        who[n++].what = 3;
      }
    }
    if (poll(pfds, (nfds_t)n, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    for (int k = 0; k < n; k++) {
      if (!pfds[k].revents) continue;
      int i = who[k].session;
      if (i == -1) {
        struct signalfd_siginfo si;
        while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        }
        reap();
        continue;
      }
      if (i == -2) {
        for (;;) {
          int c = accept4(LISTEN_FD, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (c < 0) break;
          struct session *s = calloc(1, sizeof *s);
          if (!s || nsessions >= MAX_SESSIONS) {
            close(c);
            free(s);
            break;
          }
          s->sock = c;
          s->fd_out = s->fd_err = s->fd_in = -1;
          sessions[nsessions++] = s;
        }
        continue;
      }
      struct session *s = sessions[i];
      switch (who[k].what) {
        case 0:
          if (pfds[k].revents & POLLOUT) flush_out(s);
          if (pfds[k].revents & (POLLIN | POLLHUP | POLLERR)) {
            if (buf_reserve(&s->in, READ_CHUNK) < 0) {
              s->peer_gone = 1;
              break;
            }
            ssize_t r = recv(s->sock, s->in.data + s->in.len, READ_CHUNK, MSG_DONTWAIT);
            if (r > 0) {
              s->in.len += (size_t)r;
              handle_input(s);
            } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
              s->peer_gone = 1;
            }
          }
          break;
        case 1:
        case 2:
          if (pfds[k].revents & (POLLIN | POLLHUP | POLLERR)) read_output(s, who[k].what - 1);
          break;
        case 3:
          write_stdin(s);
          break;
      }
    }
    /* Sessions are only removed here, after every event of this round was handled. */
    for (int i = nsessions - 1; i >= 0; i--) {
      struct session *s = sessions[i];
      if (s->fd_in >= 0 && s->stdin_eof && buf_pending(&s->stdin_) == 0) close_fd(&s->fd_in);
      if (!s->peer_gone) {
        finish_if_done(s);
        flush_out(s);
      }
      int answered = s->exit_sent || (s->spawned && s->pid <= 0); /* EXIT, or a refused spawn's ERROR */
      if (s->peer_gone) {
        /* Nobody will read the result: the command goes (its exec cgroup is the worker's to clean). */
        kill_command(s);
        session_free(i);
      } else if (answered && buf_pending(&s->out) == 0 && !s->shut) {
        /* The worker closes first: it may still be writing (stdin the command never read),
         * and a connection closed under its writes would lose the answer it has not read. */
        shutdown(s->sock, SHUT_WR);
        s->shut = 1;
      }
    }
  }
}
