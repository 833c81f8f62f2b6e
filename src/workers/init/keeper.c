/* rollbox-init: a slot's keeper (see rollbox-init.c). */
#define _GNU_SOURCE
#include "init.h"

/* One message to the init (a SOCK_SEQPACKET datagram): a type byte and a small body. */
static void k_send(int fd, int type, const void *body, size_t len) {
  char msg[1 + 512];
  if (len > sizeof msg - 1) len = sizeof msg - 1;
  msg[0] = (char)type;
  if (len) memcpy(msg + 1, body, len);
  ssize_t w = send(fd, msg, 1 + len, MSG_NOSIGNAL);
  (void)w;
}

/* A keeper: moves itself into its slot once, then forks the slot's commands and reports
 * their pids and exit statuses. Never returns. */
void keeper_main(int fd, const char *slot) {
  for (int i = 0; i < CGROUP_FDS; i++) {
    if (cgroup_fds[i] < 0) continue;
    char rel[MAX_SLOT_NAME + 20];
    snprintf(rel, sizeof rel, "%s/cgroup.procs", slot);
    int procs = openat(cgroup_fds[i], rel, O_WRONLY | O_CLOEXEC);
    if (procs < 0 || write(procs, "0", 1) != 1) {
      char why[160];
      int n = snprintf(why, sizeof why, "joining exec cgroup %s: %s", slot, strerror(errno));
      k_send(fd, K_FAILED, why, (size_t)n);
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
        k_send(KEEPER_FD, K_EXITED, body, 8);
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
      k_send(KEEPER_FD, K_FAILED, why, (size_t)m);
    } else {
      char body[4];
      put_u32(body, (uint32_t)pid);
      k_send(KEEPER_FD, K_STARTED, body, 4);
    }
    if (!bad) free_req(&r);
  }
}
