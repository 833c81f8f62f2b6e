/* rollbox-init: spawn requests, and a command's start between fork and exec. */
#define _GNU_SOURCE
#include "init.h"

void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

void close_from(unsigned first) {
  if (syscall(SYS_close_range, first, ~0u, 0u) < 0) {
    for (unsigned fd = first; fd < 1024; fd++) close((int)fd);
  }
}

void put_u32(char *p, uint32_t v) {
  p[0] = (char)(v & 0xff);
  p[1] = (char)((v >> 8) & 0xff);
  p[2] = (char)((v >> 16) & 0xff);
  p[3] = (char)((v >> 24) & 0xff);
}

uint32_t get_u32(const char *p) {
  const unsigned char *u = (const unsigned char *)p;
  return (uint32_t)u[0] | ((uint32_t)u[1] << 8) | ((uint32_t)u[2] << 16) | ((uint32_t)u[3] << 24);
}

/* Reads a NUL-terminated string at *p within [*p, end). */
static const char *take_str(const char **p, const char *end) {
  const char *s = *p;
  const char *nul = memchr(s, 0, (size_t)(end - s));
  if (!nul) return NULL;
  *p = nul + 1;
  return s;
}

void free_req(struct spawn_req *r) {
  free(r->argv);
  free(r->envreq);
  r->argv = r->envreq = NULL;
}

/* Payload: u32 flags, u32 stdout cap, u32 stderr cap, i32 oom_score_adj, u32 argc, u32 envc,
 * then NUL-terminated strings: slot, cwd, argv..., env "K=V"... */
const char *parse_spawn(const char *p, size_t len, struct spawn_req *r) {
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

__attribute__((noreturn, format(printf, 2, 3))) static void child_fail(int code, const char *fmt, ...) {
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
void child_exec(const struct spawn_req *r, int in_fd, int out_fd, int err_fd) {
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
