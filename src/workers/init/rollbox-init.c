/*
 * rollbox-init: PID 1 of every rollbox sandbox.
 *
 * runc starts it with the container's full config (namespaces, cgroups, seccomp filter,
 * capabilities, no_new_privs, rlimits), so every process it forks inherits exactly those.
 * It reaps every process re-parented to it, and runs commands for the worker host that
 * reaches it over a private channel:
 *
 *   fd 3  a listening AF_UNIX stream socket the worker bound to a host path that is never
 *         mounted into the container (runc --preserve-fds). Nothing inside the sandbox can
 *         connect to it: the path does not exist in the sandbox's mount namespace, and the
 *         socket lives in the host's network namespace.
 *   fd 4..6  directories of the sandbox's own pids, freezer and memory cgroups.
 *
 * Exec cgroups ("slots", made by the worker under those directories): every command runs
 * in one, so the worker can kill its whole tree (setsid and double forks included) and
 * count the OOM kills it suffered. Moving a process between cgroups waits for an RCU grace
 * period once the kernel's cgroup lock has been quiet (~10 ms here), so commands are not
 * moved: each slot has a keeper, a process forked from the init that moves itself into
 * the slot once and then forks the slot's commands, which are born inside it. The keeper
 * reports each command's pid and, from its own waitpid, its exit status. Should something
 * in the sandbox kill a keeper, its command is re-parented to the init, which reaps it; a
 * status the dead keeper took with it is reported as lost, never guessed.
 *
 * The init (and so every keeper, a fork of it) makes itself non-dumpable first:
 * /proc/1/{mem,environ,fd,...}, ptrace and pidfd_getfd then need CAP_SYS_PTRACE, which
 * sandboxes never have. Signals from inside its PID namespace never reach the init (it
 * installs no handler; SIGCHLD is blocked and read through a signalfd, and a forged SIGCHLD
 * only makes it call waitpid). Results come from waitpid, so code in the sandbox cannot
 * forge them.
 *
 * One worker connection carries one command. Frames both ways: an 8-byte header (u8
 * type, 3 bytes zero, u32 little-endian payload length) and the payload.
 *   worker -> init: SPAWN, STDIN (bytes), STDIN_EOF, PING
 *   init -> worker: STARTED (u32 pid), STDOUT, STDERR (bytes), TRUNCATED (u8 stream),
 *                   EXIT (i32 exit code, i32 raw wait status), ERROR (text), PONG (text)
 * After EXIT the init stops writing and waits for the worker to close the connection. A
 * connection that closes before EXIT kills the command's process group; a command whose
 * status was lost ends its connection without EXIT.
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
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_close_range
#define SYS_close_range 436
#endif

#define INIT_VERSION "rollbox-init 2"

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

/* Between the init and a keeper (a SOCK_SEQPACKET pair: one message each). K_SPAWN carries
 * the SPAWN payload and the command's pipe ends (stdout, stderr, then stdin if it has one);
 * K_SPAWN_FILE the same with the payload in a memfd passed last (a large one). */
enum { K_SPAWN = 1, K_STARTED = 2, K_EXITED = 3, K_FAILED = 4, K_SPAWN_FILE = 5 };
#define KEEPER_INLINE_MAX (32u << 10)

enum { SPAWN_HAS_STDIN = 1 };

#define LISTEN_FD 3
#define CGROUP_FD_FIRST 4
#define CGROUP_FDS 3
#define KEEPER_FD 3 /* in a keeper, its end of the pair */
#define HEADER_BYTES 8
#define MAX_FRAME_BYTES (16u << 20)
#define MAX_SESSIONS 1024
#define MAX_KEEPERS 256
#define MAX_SLOT_NAME 63
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
  int spawned, stdin_eof, peer_gone, exit_sent, shut, lost;
  int keeper;        /* index in keepers, or -1 (forked by the init itself) */
  pid_t pid;         /* 0 until known */
  int exited, status;
  int fd_out, fd_err, fd_in;
  uint64_t cap[2], seen[2];
  int truncated[2];
};

struct keeper {
  char slot[MAX_SLOT_NAME + 1];
  pid_t pid;
  int fd;                    /* -1 once closed */
  struct session *starting;  /* the session whose STARTED is awaited */
};

static struct session *sessions[MAX_SESSIONS];
static int nsessions;
static struct keeper keepers[MAX_KEEPERS];
static int nkeepers;
static int cgroup_fds[CGROUP_FDS] = {-1, -1, -1};
extern char **environ;

static void die(const char *what) {
  dprintf(2, "rollbox-init: %s: %s\n", what, strerror(errno));
  _exit(2);
}

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static void close_from(unsigned first) {
  if (syscall(SYS_close_range, first, ~0u, 0u) < 0) {
    for (unsigned fd = first; fd < 1024; fd++) close((int)fd);
  }
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

/* ---------------------------------------------------------------- buffers */

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

/* ---------------------------------------------------------------- spawn requests */

struct spawn_req {
  uint32_t flags;
  uint32_t cap_out, cap_err;
  int32_t oom_score_adj;
  const char *slot, *cwd;
  char **argv;   /* points into the payload */
  char **envreq; /* points into the payload */
  uint32_t argc, envc;
};

/* Reads a NUL-terminated string at *p within [*p, end). */
static const char *take_str(const char **p, const char *end) {
  const char *s = *p;
  const char *nul = memchr(s, 0, (size_t)(end - s));
  if (!nul) return NULL;
  *p = nul + 1;
  return s;
}

static void free_req(struct spawn_req *r) {
  free(r->argv);
  free(r->envreq);
  r->argv = r->envreq = NULL;
}

/* Payload: u32 flags, u32 stdout cap, u32 stderr cap, i32 oom_score_adj, u32 argc, u32 envc,
 * then NUL-terminated strings: slot, cwd, argv..., env "K=V"... */
static const char *parse_spawn(const char *p, size_t len, struct spawn_req *r) {
  const char *end = p + len;
  memset(r, 0, sizeof *r);
  if (len < 24) return "spawn frame too short";
  r->flags = get_u32(p);
  r->cap_out = get_u32(p + 4);
  r->cap_err = get_u32(p + 8);
  r->oom_score_adj = (int32_t)get_u32(p + 12);
  r->argc = get_u32(p + 16);
  r->envc = get_u32(p + 20);
  p += 24;
  if (r->argc == 0 || r->argc > len || r->envc > len) return "bad argument counts";
  r->slot = take_str(&p, end);
  r->cwd = r->slot ? take_str(&p, end) : NULL;
  if (!r->cwd) return "malformed spawn frame";
  if (strlen(r->slot) > MAX_SLOT_NAME || strchr(r->slot, '/') || !strcmp(r->slot, "..") || !strcmp(r->slot, ".")) return "bad exec cgroup name";
  r->argv = calloc(r->argc + 1, sizeof *r->argv);
  r->envreq = calloc(r->envc + 1, sizeof *r->envreq);
  if (!r->argv || !r->envreq) return "out of memory";
  for (uint32_t i = 0; i < r->argc; i++)
    if (!(r->argv[i] = (char *)take_str(&p, end))) return "malformed argv";
  for (uint32_t i = 0; i < r->envc; i++)
    if (!(r->envreq[i] = (char *)take_str(&p, end)) || !strchr(r->envreq[i], '=')) return "malformed env";
  return NULL;
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

/* Between fork and exec: the command's stdio, session, fds, cwd, environment. */
static void child_exec(const struct spawn_req *r, int in_fd, int out_fd, int err_fd) {
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
  close_from(3);
  if (chdir(r->cwd) < 0) child_fail(255, "rollbox: cannot start command: chdir to cwd (\"%s\"): %s\n", r->cwd, strerror(errno));
  char **envp = merge_env(r->envreq, r->envc);
  if (!envp) child_fail(255, "rollbox: cannot start command: out of memory\n");
  environ = envp;
  execvp(r->argv[0], r->argv);
  int e = errno;
  if (e == ENOENT && !strchr(r->argv[0], '/'))
    child_fail(127, "rollbox: cannot start command: exec: \"%s\": executable file not found in $PATH\n", r->argv[0]);
  if (e == ENOENT) child_fail(127, "rollbox: cannot start command: exec: \"%s\": no such file or directory\n", r->argv[0]);
  if (e == EACCES || e == ENOEXEC || e == EISDIR || e == EPERM)
    child_fail(126, "rollbox: cannot start command: exec: \"%s\": %s\n", r->argv[0], strerror(e));
  child_fail(255, "rollbox: cannot start command: exec: \"%s\": %s\n", r->argv[0], strerror(e));
}

/* ---------------------------------------------------------------- keepers */

static int k_send(int fd, int type, const void *body, size_t len, const int *fds, int nfds) {
  char msg[1 + 512];
  if (len > sizeof msg - 1) len = sizeof msg - 1;
  msg[0] = (char)type;
  if (len) memcpy(msg + 1, body, len);
  struct iovec iov = {.iov_base = msg, .iov_len = 1 + len};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  char cbuf[CMSG_SPACE(sizeof(int) * 3)];
  if (nfds > 0) {
    memset(cbuf, 0, sizeof cbuf);
    mh.msg_control = cbuf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
  }
  return sendmsg(fd, &mh, MSG_NOSIGNAL) < 0 ? -1 : 0;
}

/* A keeper: moves itself into its slot once, then forks the slot's commands and reports
 * their pids and exit statuses. Never returns. */
static void keeper_main(int fd, const char *slot) {
  for (int i = 0; i < CGROUP_FDS; i++) {
    if (cgroup_fds[i] < 0) continue;
    char rel[MAX_SLOT_NAME + 20];
    snprintf(rel, sizeof rel, "%s/cgroup.procs", slot);
    int procs = openat(cgroup_fds[i], rel, O_WRONLY | O_CLOEXEC);
    if (procs < 0 || write(procs, "0", 1) != 1) {
      char why[160];
      int n = snprintf(why, sizeof why, "joining exec cgroup %s: %s", slot, strerror(errno));
      k_send(fd, K_FAILED, why, (size_t)n, NULL, 0);
      _exit(1);
    }
    close(procs);
  }
  if (dup2(fd, KEEPER_FD) < 0) _exit(1);
  close_from(KEEPER_FD + 1); /* the listening socket, sessions, cgroup dirs: not a keeper's */
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD); /* still blocked, inherited from the init */
  int sfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sfd < 0) _exit(1);
  static char payload[MAX_FRAME_BYTES];
  for (;;) {
    struct pollfd p[2] = {{.fd = KEEPER_FD, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      _exit(1);
    }
    if (p[1].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
      }
      for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) break;
        char body[8];
        put_u32(body, (uint32_t)pid);
        put_u32(body + 4, (uint32_t)status);
        k_send(KEEPER_FD, K_EXITED, body, 8, NULL, 0);
      }
    }
    if (!p[0].revents) continue;
    struct iovec iov = {.iov_base = payload, .iov_len = sizeof payload};
    char cbuf[CMSG_SPACE(sizeof(int) * 4)];
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    ssize_t n = recvmsg(KEEPER_FD, &mh, MSG_CMSG_CLOEXEC);
    if (n <= 0) _exit(0); /* the init is gone (then so is the container) */
    int fds[4] = {-1, -1, -1, -1}, nfds = 0;
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    if (c && c->cmsg_type == SCM_RIGHTS) {
      nfds = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      if (nfds > 4) nfds = 4;
      memcpy(fds, CMSG_DATA(c), sizeof(int) * (size_t)nfds);
    }
    const char *bad = NULL;
    size_t len = n > 0 ? (size_t)n - 1 : 0;
    if (payload[0] == K_SPAWN_FILE && nfds >= 3) {
      int file = fds[--nfds];
      ssize_t got = pread(file, payload + 1, sizeof payload - 1, 0);
      close(file);
      fds[nfds] = -1;
      len = got > 0 ? (size_t)got : 0;
    } else if (payload[0] != K_SPAWN) {
      bad = "unexpected message";
    }
    if (!bad && nfds < 2) bad = "missing pipes";
    struct spawn_req r;
    if (!bad) bad = parse_spawn(payload + 1, len, &r);
    /* stdin is the third pipe end, when the command has one. */
    if (!bad && !(r.flags & SPAWN_HAS_STDIN) && fds[2] >= 0) close_fd(&fds[2]);
    pid_t pid = bad ? -1 : fork();
    if (pid == 0) child_exec(&r, fds[2], fds[0], fds[1]);
    for (int i = 0; i < 4; i++) close_fd(&fds[i]);
    if (bad || pid < 0) {
      char why[200];
      int m = snprintf(why, sizeof why, "%s", bad ? bad : strerror(errno));
      if (!bad) m = snprintf(why, sizeof why, "fork: %s", strerror(errno));
      k_send(KEEPER_FD, K_FAILED, why, (size_t)m, NULL, 0);
    } else {
      char body[4];
      put_u32(body, (uint32_t)pid);
      k_send(KEEPER_FD, K_STARTED, body, 4, NULL, 0);
    }
    if (!bad) free_req(&r);
  }
}

/* The live keeper of a slot, started if there is none. -1 when none can be started. */
static int keeper_for(const char *slot) {
  int free_entry = -1;
  for (int i = 0; i < nkeepers; i++) {
    if (keepers[i].pid > 0 && keepers[i].fd >= 0 && !strcmp(keepers[i].slot, slot)) return i;
    if (keepers[i].pid <= 0 && free_entry < 0) free_entry = i;
  }
  if (free_entry < 0) {
    if (nkeepers >= MAX_KEEPERS) return -1;
    free_entry = nkeepers++;
  }
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0) return -1;
  pid_t pid = fork();
  if (pid < 0) {
    close(pair[0]);
    close(pair[1]);
    return -1;
  }
  if (pid == 0) {
    close(pair[0]);
    keeper_main(pair[1], slot);
  }
  close(pair[1]);
  fcntl(pair[0], F_SETFL, O_NONBLOCK);
  struct keeper *k = &keepers[free_entry];
  memset(k, 0, sizeof *k);
  snprintf(k->slot, sizeof k->slot, "%s", slot);
  k->pid = pid;
  k->fd = pair[0];
  return free_entry;
}

/* ---------------------------------------------------------------- sessions */

/* Queues a frame for the worker. */
static void send_frame(struct session *s, int type, const void *payload, size_t len) {
  if (s->peer_gone || buf_reserve(&s->out, HEADER_BYTES + len) < 0) return;
  char *p = s->out.data + s->out.len;
  memset(p, 0, HEADER_BYTES);
  p[0] = (char)type;
  put_u32(p + 4, (uint32_t)len);
  if (len) memcpy(p + HEADER_BYTES, payload, len);
  s->out.len += HEADER_BYTES + len;
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

static void send_started(struct session *s) {
  char body[4];
  put_u32(body, (uint32_t)s->pid);
  send_frame(s, F_STARTED, body, 4);
}

static void session_free(int i) {
  struct session *s = sessions[i];
  for (int k = 0; k < nkeepers; k++)
    if (keepers[k].starting == s) keepers[k].starting = NULL;
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

static struct session *session_of_pid(pid_t pid) {
  for (int i = 0; i < nsessions; i++)
    if (sessions[i]->pid == pid && !sessions[i]->exited) return sessions[i];
  return NULL;
}

static void do_spawn(struct session *s, const char *p, size_t len) {
  if (s->spawned) {
    send_error(s, "one command per connection");
    return;
  }
  s->spawned = 1;
  struct spawn_req r;
  const char *bad = parse_spawn(p, len, &r);
  if (bad) {
    send_error(s, "%s", bad);
    free_req(&r);
    return;
  }
  int keeper = -1;
  if (r.slot[0]) {
    keeper = keeper_for(r.slot);
    if (keeper < 0) {
      send_error(s, "cannot start the keeper of exec cgroup %s: %s", r.slot, strerror(errno));
      free_req(&r);
      return;
    }
    if (keepers[keeper].starting) {
      send_error(s, "exec cgroup %s is starting another command", r.slot);
      free_req(&r);
      return;
    }
  }
  int out[2] = {-1, -1}, err[2] = {-1, -1}, in[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 || ((r.flags & SPAWN_HAS_STDIN) && pipe2(in, O_CLOEXEC) < 0)) {
    send_error(s, "pipe: %s", strerror(errno));
    goto done;
  }
  if (keeper >= 0) {
    /* The request goes to the slot's keeper as it came, with the child's ends of the pipes;
     * a large one through a memfd (a datagram is capped by the socket's buffer). */
    int fds[4] = {out[1], err[1], in[0], -1}, nfds = in[0] >= 0 ? 3 : 2;
    char head = K_SPAWN;
    char *msg = NULL;
    size_t msg_len = 1;
    if (len + 1 <= KEEPER_INLINE_MAX) {
      msg = malloc(len + 1);
      if (msg) memcpy(msg + 1, p, len);
      msg_len = len + 1;
    } else {
      int file = memfd_create("rollbox-spawn", MFD_CLOEXEC);
      if (file < 0 || write(file, p, len) != (ssize_t)len) {
        if (file >= 0) close(file);
        send_error(s, "memfd: %s", strerror(errno));
        goto done;
      }
      fds[nfds++] = file;
      head = K_SPAWN_FILE;
      msg = malloc(1);
    }
    if (!msg) {
      if (head == K_SPAWN_FILE) close(fds[nfds - 1]);
      send_error(s, "out of memory");
      goto done;
    }
    msg[0] = head;
    struct iovec iov = {.iov_base = msg, .iov_len = msg_len};
    char cbuf[CMSG_SPACE(sizeof fds)];
    memset(cbuf, 0, sizeof cbuf);
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    ssize_t sent = sendmsg(keepers[keeper].fd, &mh, MSG_NOSIGNAL);
    if (sent < 0 && !keepers[keeper].starting) {
      /* That keeper died (a timeout killed its slot) and the init has not reaped it yet:
       * it is left to be reaped, and a new one takes the command. */
      close_fd(&keepers[keeper].fd);
      keeper = keeper_for(r.slot);
      if (keeper >= 0) sent = sendmsg(keepers[keeper].fd, &mh, MSG_NOSIGNAL);
    }
    if (head == K_SPAWN_FILE) close(fds[nfds - 1]);
    free(msg);
    if (sent < 0 || keeper < 0) {
      send_error(s, "the keeper of exec cgroup %s: %s", r.slot, strerror(errno));
      goto done;
    }
    keepers[keeper].starting = s;
    s->keeper = keeper;
  } else {
    pid_t pid = fork();
    if (pid < 0) {
      send_error(s, "fork: %s", strerror(errno));
      goto done;
    }
    if (pid == 0) child_exec(&r, in[0], out[1], err[1]);
    s->pid = pid;
    send_started(s);
  }
  close_fd(&out[1]);
  close_fd(&err[1]);
  close_fd(&in[0]);
  s->fd_out = out[0];
  s->fd_err = err[0];
  s->fd_in = in[1];
  fcntl(s->fd_out, F_SETFL, O_NONBLOCK);
  fcntl(s->fd_err, F_SETFL, O_NONBLOCK);
  if (s->fd_in >= 0) fcntl(s->fd_in, F_SETFL, O_NONBLOCK);
  s->cap[0] = r.cap_out;
  s->cap[1] = r.cap_err;
  free_req(&r);
  return;
done:
  for (int i = 0; i < 2; i++) {
    close_fd(&out[i]);
    close_fd(&err[i]);
    close_fd(&in[i]);
  }
  s->lost = 1; /* nothing runs: the ERROR sent is the answer */
  free_req(&r);
}

/* Parses complete frames from the worker. */
static void handle_input(struct session *s) {
  while (buf_pending(&s->in) >= HEADER_BYTES) {
    const char *h = s->in.data + s->in.off;
    uint32_t len = get_u32(h + 4);
    if (len > MAX_FRAME_BYTES) {
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
        int n = snprintf(pong, sizeof pong, "%s pid=%d keepers=%d", INIT_VERSION, (int)getpid(), nkeepers);
        send_frame(s, F_PONG, pong, (size_t)n);
        s->lost = 1; /* answered; nothing more to say */
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

static void kill_command(struct session *s) {
  if (s->pid > 0 && !s->exited) {
    kill(-s->pid, SIGKILL);
    kill(s->pid, SIGKILL);
  }
}

/* ---------------------------------------------------------------- keeper events */

static void keeper_message(int k) {
  struct keeper *kp = &keepers[k];
  char msg[600];
  for (;;) {
    ssize_t n = recv(kp->fd, msg, sizeof msg, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {
      close_fd(&kp->fd); /* its death is handled when it is reaped */
      return;
    }
    struct session *s = kp->starting;
    if (msg[0] == K_STARTED && n >= 5) {
      kp->starting = NULL;
      if (s) {
        s->pid = (pid_t)get_u32(msg + 1);
        send_started(s);
      }
    } else if (msg[0] == K_FAILED) {
      kp->starting = NULL;
      if (s) {
        send_error(s, "%.*s", (int)(n - 1), msg + 1);
        s->lost = 1;
      }
    } else if (msg[0] == K_EXITED && n >= 9) {
      struct session *owner = session_of_pid((pid_t)get_u32(msg + 1));
      if (owner) {
        owner->exited = 1;
        owner->status = (int)get_u32(msg + 5);
      }
    }
  }
}

/* A keeper died (the sandbox killed it, or a timeout killed its slot). */
static void keeper_died(int k) {
  struct keeper *kp = &keepers[k];
  if (kp->fd >= 0) keeper_message(k); /* what it said before dying */
  close_fd(&kp->fd);
  kp->pid = 0;
  if (kp->starting) {
    send_error(kp->starting, "the keeper of exec cgroup %s died before the command started", kp->slot);
    kp->starting->lost = 1;
    kp->starting = NULL;
  }
  for (int i = 0; i < nsessions; i++) {
    struct session *s = sessions[i];
    if (s->keeper != k || s->pid <= 0 || s->exited) continue;
    /* Its command is the init's child now, unless the keeper reaped it and took the status along. */
    int status;
    pid_t r = waitpid(s->pid, &status, WNOHANG);
    if (r == s->pid) {
      s->exited = 1;
      s->status = status;
    } else if (r < 0) {
      s->lost = 1;
    }
    s->keeper = -1;
  }
}

static void reap(void) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    int k;
    for (k = 0; k < nkeepers && keepers[k].pid != pid; k++) {
    }
    if (k < nkeepers) {
      keeper_died(k);
      continue;
    }
    struct session *s = session_of_pid(pid);
    if (s) {
      s->exited = 1;
      s->status = status;
    }
  }
}

/* ---------------------------------------------------------------- main loop */

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
  close_from(CGROUP_FD_FIRST + CGROUP_FDS);
}

int main(void) {
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) die("prctl(PR_SET_DUMPABLE)");
  setup_fds();
  signal(SIGPIPE, SIG_IGN);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  if (sigprocmask(SIG_BLOCK, &chld, NULL) < 0) die("sigprocmask");
  int sfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sfd < 0) die("signalfd");

  /* Per session at most: socket, stdout, stderr, stdin; plus keepers. */
  enum { W_SIGNAL = -1, W_LISTEN = -2, W_KEEPER = -3 };
  static struct pollfd pfds[2 + MAX_SESSIONS * 4 + MAX_KEEPERS];
  static struct {
    int session, what;
  } who[2 + MAX_SESSIONS * 4 + MAX_KEEPERS];
  for (;;) {
    int n = 0;
    pfds[n] = (struct pollfd){.fd = sfd, .events = POLLIN};
    who[n++].session = W_SIGNAL;
    if (nsessions < MAX_SESSIONS) {
      pfds[n] = (struct pollfd){.fd = LISTEN_FD, .events = POLLIN};
      who[n++].session = W_LISTEN;
    }
    for (int k = 0; k < nkeepers; k++) {
      if (keepers[k].fd < 0) continue;
      pfds[n] = (struct pollfd){.fd = keepers[k].fd, .events = POLLIN};
      who[n].session = W_KEEPER;
      who[n++].what = k;
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
    for (int j = 0; j < n; j++) {
      if (!pfds[j].revents) continue;
      int i = who[j].session;
      if (i == W_SIGNAL) {
        struct signalfd_siginfo si;
        while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        }
        reap();
        continue;
      }
      if (i == W_KEEPER) {
        if (keepers[who[j].what].fd == pfds[j].fd) keeper_message(who[j].what);
        continue;
      }
      if (i == W_LISTEN) {
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
          s->keeper = -1;
          s->fd_out = s->fd_err = s->fd_in = -1;
          sessions[nsessions++] = s;
        }
        continue;
      }
      struct session *s = sessions[i];
      switch (who[j].what) {
        case 0:
          if (pfds[j].revents & POLLOUT) flush_out(s);
          if (pfds[j].revents & (POLLIN | POLLHUP | POLLERR)) {
            if (buf_reserve(&s->in, READ_CHUNK) < 0) {
              s->peer_gone = 1;
              break;
            }
            ssize_t r = recv(s->sock, s->in.data + s->in.len, READ_CHUNK, MSG_DONTWAIT);
            if (r > 0) {
              s->in.len += (size_t)r;
              if (!s->shut) handle_input(s);
              else s->in.off = s->in.len; /* answered: what still comes is dropped */
            } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
              s->peer_gone = 1;
            }
          }
          break;
        case 1:
        case 2:
          if (pfds[j].revents & (POLLIN | POLLHUP | POLLERR)) read_output(s, who[j].what - 1);
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
      if (s->lost && !s->exit_sent) kill_command(s);
      if (!s->peer_gone && !s->lost) finish_if_done(s);
      if (!s->peer_gone) flush_out(s);
      if (s->peer_gone) {
        /* Nobody will read the result: the command goes (its exec cgroup is the worker's to clean). */
        kill_command(s);
        session_free(i);
      } else if ((s->exit_sent || s->lost) && buf_pending(&s->out) == 0 && !s->shut) {
        /* The worker closes first: it may still be writing (stdin the command never read),
         * and a connection closed under its writes would lose the answer it has not read. */
        shutdown(s->sock, SHUT_WR);
        s->shut = 1;
      }
    }
  }
}
