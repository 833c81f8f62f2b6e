/*
 * rollbox-init: PID 1 of every rollbox sandbox.
 *
 * Longer than most: the event loop, its sessions (durable commands' logs included) and
 * the init's side of the keepers share one poll set and one table; spawn requests and the
 * keeper process are in spawn.c and keeper.c.
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
 *   worker -> init: SPAWN, STDIN (bytes), STDIN_EOF, SIGNAL (i32), FORGET,
 *                   ATTACH (u64 from-offset, command id), RELEASE, RESIZE (u16 cols, u16 rows)
 *   init -> worker: STARTED (u32 pid), STDOUT, STDERR (bytes), TRUNCATED (u8 stream),
 *                   EXIT (i32 exit code, i32 raw wait status, u32 OOM kills its exec
 *                   cgroup counted while it ran), ERROR (text),
 *                   ATTACHED (u32 pid, u32 flags: 1 exited, 2 stdin open, 4 pty; slot), UNKNOWN,
 *                   RELEASED (u32 count)
 * After EXIT the init stops writing and waits for the worker to close the connection. A
 * connection that closes before EXIT kills the command's process group, unless the spawn
 * was durable; a command whose status was lost ends its connection without EXIT.
 *
 * Durable commands (SPAWN_DURABLE: a command id and a grace) outlive their connection: the
 * init keeps reading their output into a log of output frames (in memory up to
 * LOG_MEM_BYTES, then in an unnamed file in the sandbox's /tmp, or a memfd), bounded by
 * the spawn's caps, and their exit status. ATTACH on a new connection (a restarted worker)
 * replays the log from an offset, streams on, and ends with EXIT; the worker sends FORGET
 * once it recorded the result. A durable command nobody attaches to within its grace is
 * killed (or, finished, dropped). One whose status was lost is kept as such for its grace
 * (ATTACH answers ERROR), so UNKNOWN within a grace of the spawn means "never received".
 *
 * PTY commands (SPAWN_PTY, with a size): the init opens a pseudo-terminal in the sandbox's
 * own /dev/pts; its slave end is the command's stdin, stdout and stderr and the controlling
 * terminal of its session, its master the command's one output stream (STDOUT frames) and
 * its input (STDIN). RESIZE sets the window size; the kernel signals SIGWINCH to the
 * terminal's foreground process group. Otherwise a command like the others: durable, its
 * output logged and capped, signalled, its exit reported.
 *
 * RELEASE (a microVM's fork child, before its first command: its memory is its parent's, so
 * the init holds the parent's durable commands, whose callers wait on the parent) lets go of
 * every durable command: each runs on as a detached process, its stdin closed, its output
 * read and dropped, never killed by a grace, no longer attachable; forgotten once it exited.
 *
 * Static, no libc of the image's, no shell: it works in any base image.
 */
#define _GNU_SOURCE
#include "init.h"
#include <time.h>

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
  int pending_signal; /* a SIGNAL that came before the pid was known, delivered once it is */
  int exited, status;
  int fd_out, fd_err, fd_in;
  uint64_t cap[2], seen[2];
  int truncated[2];
  int dropped[2];      /* a frame of this stream the log could not keep: TRUNCATED is sent again before EXIT */
  /* Durable commands only (id set): they outlive their connection, sock -1 while none holds them. */
  char *id;
  uint32_t grace_ms;
  int64_t detached_ms; /* when the last connection went (monotonic) */
  int forgotten;       /* FORGET came: dropped once its connection ends */
  int took_over;       /* this connection's socket moved to the command it ATTACHed to */
  struct buf log;      /* output frames, in memory until spilled */
  int log_fd;          /* the spill file, or -1 */
  uint64_t log_len;    /* bytes of output frames in all */
  uint64_t sent;       /* of those, queued to the current connection */
  char slot[MAX_SLOT_NAME + 1];
  uint32_t oom_before; /* the slot's OOM kill count when the command was spawned */
  int released;        /* RELEASE let go of it: it runs on, its output dropped, until it exits */
  int pty;             /* SPAWN_PTY: fd_out (and fd_in) is the master of its terminal */
};

static void signal_command(struct session *s, int sig);

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
int cgroup_fds[CGROUP_FDS] = {-1, -1, -1};

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void die(const char *what) {
  dprintf(2, "rollbox-init: %s: %s\n", what, strerror(errno));
  _exit(2);
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

/* ---------------------------------------------------------------- keepers */

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
  if (s->peer_gone || s->sock < 0 || buf_reserve(&s->out, HEADER_BYTES + len) < 0) return;
  char *p = s->out.data + s->out.len;
  memset(p, 0, HEADER_BYTES);
  p[0] = (char)type;
  put_u32(p + 4, (uint32_t)len);
  if (len) memcpy(p + HEADER_BYTES, payload, len);
  s->out.len += HEADER_BYTES + len;
}

/* ---------------------------------------------------------------- durable output log */

static int pwrite_all(int fd, const char *p, size_t len, uint64_t at) {
  while (len > 0) {
    ssize_t n = pwrite(fd, p, len, (off_t)at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
    at += (uint64_t)n;
  }
  return 0;
}

/* Past LOG_MEM_BYTES the log goes to the sandbox's disk (its writable area counts it), or
 * to a memfd when there is no writable /tmp or /. */
static int spill_open(void) {
  int fd = open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) fd = open("/", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) fd = memfd_create("rollbox-output", MFD_CLOEXEC);
  return fd;
}

/* The spill file could not take more (the sandbox's disk is full): the log so far moves to
 * a memfd (memory the sandbox's cgroup pays for, as for its output in memory). */
static int spill_to_memory(struct session *s) {
  int fd = memfd_create("rollbox-output", MFD_CLOEXEC);
  if (fd < 0) return -1;
  char chunk[READ_CHUNK];
  for (uint64_t at = 0; at < s->log_len;) {
    size_t want = s->log_len - at > sizeof chunk ? sizeof chunk : (size_t)(s->log_len - at);
    ssize_t got = pread(s->log_fd, chunk, want, (off_t)at);
    if (got <= 0 || pwrite_all(fd, chunk, (size_t)got, at) < 0) {
      close(fd);
      return -1;
    }
    at += (uint64_t)got;
  }
  close(s->log_fd);
  s->log_fd = fd;
  return 0;
}

static int log_write(struct session *s, const char *h, const void *payload, size_t len) {
  return pwrite_all(s->log_fd, h, HEADER_BYTES, s->log_len) < 0 || pwrite_all(s->log_fd, payload, len, s->log_len + HEADER_BYTES) < 0 ? -1 : 0;
}

/* An output frame of a durable command: kept until it is collected. One that cannot be
 * kept (no disk, no memory) is counted as dropped, and its stream reported truncated. */
static void log_append(struct session *s, int type, const void *payload, size_t len) {
  char h[HEADER_BYTES] = {0};
  h[0] = (char)type;
  put_u32(h + 4, (uint32_t)len);
  if (s->log_fd < 0 && s->log_len + HEADER_BYTES + len > LOG_MEM_BYTES) {
    int fd = spill_open();
    if (fd >= 0 && (s->log.len == 0 || pwrite_all(fd, s->log.data, s->log.len, 0) == 0)) {
      s->log_fd = fd;
      buf_free(&s->log);
    } else if (fd >= 0) {
      close(fd);
    }
  }
  int stream = type == F_STDERR || (type == F_TRUNCATED && len == 1 && ((const char *)payload)[0] == 1) ? 1 : 0;
  if (s->log_fd >= 0) {
    /* A failed write leaves log_len: what it wrote is overwritten by the next frame. */
    if (log_write(s, h, payload, len) < 0 && (spill_to_memory(s) < 0 || log_write(s, h, payload, len) < 0)) {
      s->dropped[stream] = 1;
      return;
    }
  } else {
    if (buf_reserve(&s->log, HEADER_BYTES + len) < 0) {
      s->dropped[stream] = 1;
      return;
    }
    memcpy(s->log.data + s->log.len, h, HEADER_BYTES);
    memcpy(s->log.data + s->log.len + HEADER_BYTES, payload, len);
    s->log.len += HEADER_BYTES + len;
  }
  s->log_len += HEADER_BYTES + len;
}

/* Moves logged frames to the connection as it takes them. */
static void pump_log(struct session *s) {
  while (s->sock >= 0 && !s->peer_gone && s->sent < s->log_len && buf_pending(&s->out) < OUT_HIGH_WATER) {
    size_t n = s->log_len - s->sent > READ_CHUNK ? READ_CHUNK : (size_t)(s->log_len - s->sent);
    if (buf_reserve(&s->out, n) < 0) return;
    char *dst = s->out.data + s->out.len;
    if (s->log_fd >= 0) {
      ssize_t r = pread(s->log_fd, dst, n, (off_t)s->sent);
      if (r <= 0) return;
      n = (size_t)r;
    } else {
      memcpy(dst, s->log.data + s->sent, n);
    }
    s->out.len += n;
    s->sent += n;
  }
}

/* Output goes to the log of a durable command, straight to the connection otherwise. */
static void emit(struct session *s, int type, const void *payload, size_t len) {
  if (s->id) log_append(s, type, payload, len);
  else send_frame(s, type, payload, len);
}

/* Its connection went: a durable command runs on, its output logged, for its grace. */
static void detach(struct session *s) {
  close_fd(&s->sock);
  buf_free(&s->in);
  buf_free(&s->out);
  s->peer_gone = s->shut = s->exit_sent = 0;
  s->sent = 0;
  s->detached_ms = mono_ms();
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
  buf_free(&s->log);
  close_fd(&s->log_fd);
  free(s->id);
  free(s);
  sessions[i] = sessions[--nsessions];
}

static struct session *session_of_pid(pid_t pid) {
  for (int i = 0; i < nsessions; i++)
    if (sessions[i]->pid == pid && !sessions[i]->exited) return sessions[i];
  return NULL;
}

/* For a SPAWN with slot AUTO_SLOT: a slot with a live, idle keeper and nothing else in it,
 * else a new one; "" (no exec cgroup) when none can be had. */
static void choose_slot(char out[MAX_SLOT_NAME + 1]) {
  const size_t len = MAX_SLOT_NAME + 1;
  static unsigned next_auto;
  for (int k = 0; k < nkeepers; k++) {
    struct keeper *kp = &keepers[k];
    if (kp->pid <= 0 || kp->fd < 0 || kp->starting) continue;
    int busy = 0;
    for (int i = 0; i < nsessions && !busy; i++) busy = sessions[i]->keeper == k && !sessions[i]->exited;
    if (busy || slot_population(kp->slot) != 1) continue;
    memcpy(out, kp->slot, len);
    return;
  }
  snprintf(out, len, "a%u", next_auto++);
  if (nkeepers >= MAX_KEEPERS || slot_make(out) < 0) out[0] = 0;
}

/* A pty for a SPAWN_PTY command, at its size: out = {master, slave}, in = {slave's stdin
 * (unused, -1), a second fd of the master for its input}. NULL, or what failed (errno set).
 * Opened here, in the sandbox's /dev/pts (runc mounts a devpts of the container's own). */
static const char *open_pty(int out[2], int in[2], const struct spawn_req *r) {
  int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) return "posix_openpt";
  char name[64];
  if (grantpt(master) < 0 || unlockpt(master) < 0 || ptsname_r(master, name, sizeof name) != 0) {
    int e = errno;
    close(master);
    errno = e;
    return "unlockpt";
  }
  struct winsize ws = {.ws_row = r->rows, .ws_col = r->cols};
  int slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  int input = slave >= 0 ? fcntl(master, F_DUPFD_CLOEXEC, 0) : -1;
  if (slave < 0 || input < 0 || ioctl(master, TIOCSWINSZ, &ws) < 0) {
    int e = errno;
    close(master);
    if (slave >= 0) close(slave);
    if (input >= 0) close(input);
    errno = e;
    return slave < 0 ? name : "TIOCSWINSZ";
  }
  out[0] = master;
  out[1] = slave;
  in[0] = -1;
  in[1] = input;
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
  if (!bad && r.id) {
    for (int i = 0; i < nsessions && !bad; i++)
      if (sessions[i]->id && !strcmp(sessions[i]->id, r.id)) bad = "a command of that id exists";
  }
  if (bad) {
    send_error(s, "%s", bad);
    s->lost = 1;
    free_req(&r);
    return;
  }
  char chosen[MAX_SLOT_NAME + 1];
  if (!strcmp(r.slot, AUTO_SLOT)) {
    choose_slot(chosen);
    r.slot = chosen;
  }
  s->oom_before = slot_oom_kills(r.slot);
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
  if (r.flags & SPAWN_PTY) {
    /* A terminal instead of pipes: the master is the command's output and its input (one
     * stream, as a terminal has), the slave its stdin, stdout and stderr. */
    const char *why = open_pty(out, in, &r);
    if (why) {
      send_error(s, "pty: %s: %s", why, strerror(errno));
      goto done;
    }
    err[1] = out[1];
  } else if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 || ((r.flags & SPAWN_HAS_STDIN) && pipe2(in, O_CLOEXEC) < 0)) {
    send_error(s, "pipe: %s", strerror(errno));
    goto done;
  }
  if (keeper >= 0) {
    /* The request goes to the slot's keeper as it came, with the child's ends of the pipes;
     * a large one through a memfd (a datagram is capped by the socket's buffer). */
    int fds[4] = {out[1], err[1], (r.flags & SPAWN_PTY) ? out[1] : in[0], -1}, nfds = fds[2] >= 0 ? 3 : 2;
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
    if (pid == 0) child_exec(&r, (r.flags & SPAWN_PTY) ? out[1] : in[0], out[1], err[1]);
    s->pid = pid;
    send_started(s);
    if (s->pending_signal) signal_command(s, s->pending_signal);
  }
  close_fd(&out[1]);
  if (r.flags & SPAWN_PTY) err[1] = -1; /* the same fd as out[1], closed */
  close_fd(&err[1]);
  close_fd(&in[0]);
  s->fd_out = out[0];
  s->fd_err = err[0];
  s->fd_in = in[1];
  s->pty = (r.flags & SPAWN_PTY) != 0;
  fcntl(s->fd_out, F_SETFL, O_NONBLOCK);
  if (s->fd_err >= 0) fcntl(s->fd_err, F_SETFL, O_NONBLOCK);
  if (s->fd_in >= 0) fcntl(s->fd_in, F_SETFL, O_NONBLOCK);
  s->cap[0] = r.cap_out;
  s->cap[1] = r.cap_err;
  snprintf(s->slot, sizeof s->slot, "%s", r.slot);
  if (r.id) {
    s->id = strdup(r.id);
    s->grace_ms = r.grace_ms;
  }
  free_req(&r);
  return;
done:
  if (r.flags & SPAWN_PTY) err[1] = -1; /* the same fd as out[1] */
  for (int i = 0; i < 2; i++) {
    close_fd(&out[i]);
    close_fd(&err[i]);
    close_fd(&in[i]);
  }
  s->lost = 1; /* nothing runs: the ERROR sent is the answer */
  free_req(&r);
}

/* ATTACH on a fresh connection: the connection moves to the durable command of that id. */
static void do_attach(struct session *s, const char *p, size_t len) {
  if (s->spawned) {
    send_error(s, "one command per connection");
    return;
  }
  s->spawned = 1;
  s->lost = 1; /* unless it attaches: the answer ends this connection */
  const char *id = p + 8;
  if (len < 10 || len > 9 + MAX_COMMAND_ID || p[len - 1] != 0 || strlen(id) != len - 9) {
    send_error(s, "malformed attach frame");
    return;
  }
  uint64_t from = (uint64_t)get_u32(p) | ((uint64_t)get_u32(p + 4) << 32);
  struct session *c = NULL;
  for (int i = 0; i < nsessions && !c; i++)
    if (sessions[i] != s && sessions[i]->id && !strcmp(sessions[i]->id, id)) c = sessions[i];
  if (!c) {
    send_frame(s, F_UNKNOWN, NULL, 0);
    return;
  }
  if (c->lost) {
    /* Kept until its grace so this is not mistaken for a command the init never received. */
    send_error(s, "the exit status of command %s was lost (its keeper was killed)", id);
    return;
  }
  if (from > c->log_len) {
    send_error(s, "offset %llu is past the command's output (%llu bytes)", (unsigned long long)from, (unsigned long long)c->log_len);
    return;
  }
  /* A connection still holding it (a worker that died, not yet noticed) is dropped. */
  close_fd(&c->sock);
  buf_free(&c->in);
  buf_free(&c->out);
  c->sock = s->sock;
  s->sock = -1;
  s->took_over = 1;
  c->peer_gone = c->shut = c->exit_sent = c->forgotten = 0;
  c->sent = from;
  char body[8 + MAX_SLOT_NAME];
  size_t slot_len = strlen(c->slot);
  put_u32(body, (uint32_t)c->pid);
  put_u32(body + 4, (uint32_t)((c->exited ? 1 : 0) | (c->fd_in >= 0 ? 2 : 0) | (c->pty ? 4 : 0)));
  memcpy(body + 8, c->slot, slot_len);
  send_frame(c, F_ATTACHED, body, 8 + slot_len);
}

/* A durable command let go of (RELEASE): no connection, no stdin, no log, no id; it runs on. */
static void release_session(struct session *c) {
  close_fd(&c->sock);
  close_fd(&c->fd_in);
  close_fd(&c->log_fd);
  buf_free(&c->in);
  buf_free(&c->out);
  buf_free(&c->stdin_);
  buf_free(&c->log);
  free(c->id);
  c->id = NULL;
  c->released = 1;
}

/* RELEASE on a fresh connection: every durable command but this one is let go of; RELEASED says how many. */
static void do_release(struct session *s) {
  if (s->spawned) {
    send_error(s, "one command per connection");
    return;
  }
  s->spawned = 1;
  s->lost = 1; /* nothing runs here: the answer ends this connection */
  uint32_t n = 0;
  for (int i = 0; i < nsessions; i++) {
    if (sessions[i] == s || !sessions[i]->id) continue;
    release_session(sessions[i]);
    n++;
  }
  char body[4];
  put_u32(body, n);
  send_frame(s, F_RELEASED, body, 4);
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
      case F_ATTACH:
        do_attach(s, payload, len);
        if (s->took_over) return; /* the worker sends nothing more before ATTACHED */
        break;
      case F_SIGNAL: {
        int sig = len == 4 ? (int)get_u32(payload) : 0;
        if (sig < 1 || sig > 64) {
          send_error(s, "bad signal frame");
          s->lost = 1;
        } else if (s->pid == 0 && !s->exited) {
          s->pending_signal = sig; /* its keeper has not said it started yet */
        } else if (s->pid > 0 && !s->exited) {
          signal_command(s, sig);
        }
        break;
      }
      case F_RESIZE: {
        /* The kernel sends SIGWINCH to the terminal's foreground process group itself. An
         * ERROR would end the command's connection: a resize that cannot apply (not a pty,
         * a zero size, a terminal already closed) changes nothing, and the worker checks first. */
        int fd = s->fd_out >= 0 ? s->fd_out : s->fd_in;
        struct winsize ws = {.ws_col = len == 4 ? (unsigned short)(get_u32(payload) & 0xffff) : 0, .ws_row = len == 4 ? (unsigned short)(get_u32(payload) >> 16) : 0};
        if (s->pty && fd >= 0 && ws.ws_col && ws.ws_row) ioctl(fd, TIOCSWINSZ, &ws);
        break;
      }
      case F_FORGET:
        if (s->id && s->exit_sent) s->forgotten = 1;
        break;
      case F_RELEASE:
        do_release(s);
        break;
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
  if (keep > 0) emit(s, k == 0 ? F_STDOUT : F_STDERR, chunk, keep);
  if (keep < (size_t)n && !s->truncated[k]) {
    s->truncated[k] = 1;
    char which = (char)k;
    emit(s, F_TRUNCATED, &which, 1);
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

/* A durable command's log goes out as fast as the connection takes it: a socket that took
 * all that was queued raises no POLLOUT, so the next piece is queued now, not after some
 * event that may never come (a command that ended). */
static void pump_and_flush(struct session *s) {
  for (;;) {
    uint64_t before = s->sent;
    pump_log(s);
    flush_out(s);
    if (s->peer_gone || buf_pending(&s->out) > 0 || s->sent == s->log_len || s->sent == before) return;
  }
}

/* A signal to the command's process group (or to it alone, if it left the group). */
static void signal_command(struct session *s, int sig) {
  if (kill(-s->pid, sig) < 0) kill(s->pid, sig);
  s->pending_signal = 0;
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
        if (s->pending_signal) signal_command(s, s->pending_signal);
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
  if (s->exit_sent || !s->exited || s->fd_out >= 0 || s->fd_err >= 0 || s->sock < 0 || s->sent < s->log_len) return;
  int code = WIFEXITED(s->status) ? WEXITSTATUS(s->status) : WIFSIGNALED(s->status) ? 128 + WTERMSIG(s->status) : 255;
  /* A stream whose log dropped a frame says so again right before EXIT (so a replay from any offset has it). */
  for (int k = 0; k < 2; k++) {
    if (!s->dropped[k]) continue; /* (a second TRUNCATED of a stream changes nothing) */
    char which = (char)k;
    send_frame(s, F_TRUNCATED, &which, 1);
  }
  uint32_t oom_now = slot_oom_kills(s->slot);
  char payload[12];
  put_u32(payload, (uint32_t)code);
  put_u32(payload + 4, (uint32_t)s->status);
  put_u32(payload + 8, oom_now > s->oom_before ? oom_now - s->oom_before : 0);
  send_frame(s, F_EXIT, payload, 12);
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
    int timeout_ms = -1; /* until the first detached command's grace runs out */
    int64_t now = mono_ms();
    for (int i = 0; i < nsessions; i++) {
      struct session *s = sessions[i];
      if (s->sock >= 0 || s->released) continue;
      int64_t left = s->detached_ms + s->grace_ms - now;
      if (left < 0) left = 0;
      if (left > 1 << 30) left = 1 << 30;
      if (timeout_ms < 0 || left < timeout_ms) timeout_ms = (int)left;
    }
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
      /* A durable command's output goes to its log, bounded by its caps: always read. */
      int out_ok = s->id || buf_pending(&s->out) < OUT_HIGH_WATER;
      if (s->sock >= 0) {
        short sock_events = 0;
        if (!s->peer_gone && buf_pending(&s->stdin_) < IN_HIGH_WATER) sock_events |= POLLIN;
        if (buf_pending(&s->out) > 0) sock_events |= POLLOUT;
        pfds[n] = (struct pollfd){.fd = s->sock, .events = sock_events};
        who[n].session = i;
        who[n++].what = 0;
      }
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
    if (poll(pfds, (nfds_t)n, timeout_ms) < 0) {
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
          s->fd_out = s->fd_err = s->fd_in = s->log_fd = -1;
          sessions[nsessions++] = s;
        }
        continue;
      }
      struct session *s = sessions[i];
      switch (who[j].what) {
        case 0:
          if (pfds[j].fd != s->sock) break; /* the socket was replaced by an ATTACH this round */
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
    now = mono_ms();
    for (int i = nsessions - 1; i >= 0; i--) {
      struct session *s = sessions[i];
      if (s->took_over) {
        session_free(i);
        continue;
      }
      if (s->released) {
        /* Gone once its process exited and its output pipes closed (their last writer gone). */
        if ((s->exited || s->lost) && s->fd_out < 0 && s->fd_err < 0) session_free(i);
        continue;
      }
      if (s->fd_in >= 0 && s->stdin_eof && buf_pending(&s->stdin_) == 0) close_fd(&s->fd_in);
      if (s->lost && !s->exit_sent) kill_command(s);
      if (s->sock < 0) {
        /* Detached: nobody attached within the grace: it goes. */
        if (now - s->detached_ms >= (int64_t)s->grace_ms) {
          kill_command(s);
          session_free(i);
        }
        continue;
      }
      if (s->id) pump_and_flush(s);
      if (!s->peer_gone && !s->lost) finish_if_done(s);
      if (!s->peer_gone) flush_out(s);
      if (s->peer_gone && s->id && !s->forgotten) {
        detach(s);
      } else if (s->peer_gone) {
        /* Nobody will read the result: the command goes (its exec cgroup is the worker's to clean). */
        kill_command(s);
        session_free(i);
      } else if ((s->lost || (s->exit_sent && !s->id)) && buf_pending(&s->out) == 0 && !s->shut) {
        /* The worker closes first: it may still be writing (stdin the command never read),
         * and a connection closed under its writes would lose the answer it has not read. */
        shutdown(s->sock, SHUT_WR);
        s->shut = 1;
      }
    }
  }
}
