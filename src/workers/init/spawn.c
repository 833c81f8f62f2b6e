/* rollbox-init: spawn requests, and a command's start between fork and exec. */
#define _GNU_SOURCE
#include "init.h"
#include <grp.h> /* setgroups only: users are resolved from the files, never through NSS */

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
 * then NUL-terminated strings: slot, cwd, argv..., env "K=V"..., and with SPAWN_HAS_USER
 * the user ("name", "uid", "name:group" or "uid:gid"); with SPAWN_DURABLE the command id
 * and then a u32 grace in milliseconds; with SPAWN_PTY last a u16 cols and a u16 rows. */
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
  if (r->flags & SPAWN_HAS_USER) {
    r->user = take_str(&p, end);
    if (!r->user || !r->user[0] || strlen(r->user) > MAX_USER_SPEC) return "malformed user";
  }
  if (r->flags & SPAWN_DURABLE) {
    r->id = take_str(&p, end);
    if (!r->id || !r->id[0] || strlen(r->id) > MAX_COMMAND_ID || end - p < 4) return "malformed command id";
    r->grace_ms = get_u32(p);
    p += 4;
  }
  if (r->flags & SPAWN_PTY) {
    if (!(r->flags & SPAWN_HAS_STDIN)) return "a pty command has stdin";
    if (end - p < 4) return "malformed pty size";
    uint32_t size = get_u32(p);
    r->cols = (uint16_t)(size & 0xffff);
    r->rows = (uint16_t)(size >> 16);
    if (!r->cols || !r->rows) return "bad pty size";
  }
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

/*
 * A command's user, resolved as Docker and runc do, against the sandbox's own /etc/passwd
 * and /etc/group (the child already runs inside its root). They are read as plain files:
 * NSS would load the image's libc modules into this static binary. Whatever code in the
 * sandbox wrote there decides only who this command runs as.
 */
#define ACCOUNT_FILE_MAX (4u << 20)
#define ID_MAX 2147483647LL /* the range Docker and runc accept */
#define GROUPS_MAX 65536    /* the kernel's NGROUPS_MAX */

struct account {
  long long uid, gid;
  const char *name; /* its /etc/passwd name; NULL without an entry */
  const char *home;
  gid_t *groups; /* supplementary */
  size_t ngroups, cap;
};

/* A decimal uid or gid: the id; -1 if s is not a number, -2 if it is one out of range. */
static long long parse_id(const char *s) {
  long long v = 0;
  if (!*s) return -1;
  for (; *s; s++) {
    if (*s < '0' || *s > '9') return -1;
    if (v <= ID_MAX) v = v * 10 + (*s - '0');
  }
  return v > ID_MAX ? -2 : v;
}

static void check_id(long long id) {
  if (id == -2) child_fail(126, "rollbox: cannot start command: uids and gids must be in range 0-%lld\n", ID_MAX);
}

/* The whole file, NUL-terminated; empty if there is none. Only a regular file of at most
 * ACCOUNT_FILE_MAX is read: the sandbox may have put a FIFO or /dev/zero in its place. */
static char *read_account_file(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  struct stat st;
  if (fd < 0 && (errno == ENOENT || errno == ENOTDIR)) {
    char *none = calloc(1, 1);
    if (!none) child_fail(126, "rollbox: cannot start command: out of memory\n");
    return none;
  }
  if (fd < 0 || fstat(fd, &st) < 0) child_fail(126, "rollbox: cannot start command: %s: %s\n", path, strerror(errno));
  if (!S_ISREG(st.st_mode)) child_fail(126, "rollbox: cannot start command: %s is not a regular file\n", path);
  if (st.st_size > (off_t)ACCOUNT_FILE_MAX) child_fail(126, "rollbox: cannot start command: %s is larger than 4 MiB\n", path);
  size_t size = (size_t)st.st_size, n = 0;
  char *buf = malloc(size + 1);
  if (!buf) child_fail(126, "rollbox: cannot start command: out of memory\n");
  while (n < size) {
    ssize_t got = read(fd, buf + n, size - n);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) child_fail(126, "rollbox: cannot start command: %s: %s\n", path, strerror(errno));
    if (got == 0) break; /* it shrank meanwhile */
    n += (size_t)got;
  }
  close(fd);
  buf[n] = 0;
  return buf;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* Cuts the next entry off *p (in place) into `max` ':'-separated fields, NULL where a line
 * has fewer. Lines are trimmed; blank ones and comments skipped. 0 when none is left. */
static int next_entry(char **p, char **field, int max) {
  while (**p) {
    char *line = *p, *nl = strchr(line, '\n');
    *p = nl ? nl + 1 : line + strlen(line);
    if (nl) *nl = 0;
    while (is_space(*line)) line++;
    for (size_t len = strlen(line); len > 0 && is_space(line[len - 1]); len--) line[len - 1] = 0;
    if (!*line || *line == '#') continue;
    for (int i = 0; i < max; i++) {
      field[i] = line;
      char *colon = line ? strchr(line, ':') : NULL;
      if (colon) *colon = 0;
      line = colon ? colon + 1 : NULL;
    }
    return 1;
  }
  return 0;
}

/* The first passwd entry named `user` or, for a number, with that uid. A number without
 * one stands for itself, with gid 0 and home / (as in Docker). Unlike Docker, a number is
 * never taken for a name: an entry named "0" must not turn "0" into another uid. */
static void find_user(const char *user, struct account *a) {
  long long id = parse_id(user);
  check_id(id);
  char *p = read_account_file("/etc/passwd"), *f[7];
  while (next_entry(&p, f, 7)) {
    if (!f[3]) continue;
    long long uid = parse_id(f[2]), gid = parse_id(f[3]);
    if (uid < 0 || gid < 0 || (id >= 0 ? uid != id : strcmp(f[0], user) != 0)) continue;
    *a = (struct account){.uid = uid, .gid = gid, .name = f[0], .home = f[5] && f[5][0] ? f[5] : "/"};
    return;
  }
  if (id < 0) child_fail(126, "rollbox: cannot start command: unable to find user %s: no matching entries in /etc/passwd\n", user);
  *a = (struct account){.uid = id, .gid = 0, .home = "/"};
}

/* Whether a group's comma-separated member list names `name`. */
static int lists(char *members, const char *name) {
  for (char *m = strtok(members, ","); m; m = strtok(NULL, ","))
    if (!strcmp(m, name)) return 1;
  return 0;
}

static void add_group(struct account *a, long long gid) {
  if (a->ngroups == a->cap) {
    a->cap = a->cap ? a->cap * 2 : 16;
    if (a->cap > GROUPS_MAX) child_fail(126, "rollbox: cannot start command: user %s is in more than %d groups\n", a->name, GROUPS_MAX);
    a->groups = realloc(a->groups, a->cap * sizeof *a->groups);
    if (!a->groups) child_fail(126, "rollbox: cannot start command: out of memory\n");
  }
  a->groups[a->ngroups++] = (gid_t)gid;
}

/* The group part (a number stands for itself, a name is looked up) replaces the primary
 * gid; the supplementary groups are those whose member list names the user. */
static void find_groups(const char *group, struct account *a) {
  long long want = group ? parse_id(group) : -1;
  check_id(want);
  if (want >= 0) a->gid = want;
  int found = !group || want >= 0;
  if (found && !a->name) return; /* nothing to look up: a uid without an entry has no name to be listed under */
  char *p = read_account_file("/etc/group"), *f[4];
  while (next_entry(&p, f, 4)) {
    long long gid = f[2] ? parse_id(f[2]) : -1;
    if (gid < 0) continue;
    if (!found && !strcmp(f[0], group)) {
      a->gid = gid;
      found = 1;
    }
    if (a->name && f[3] && lists(f[3], a->name)) add_group(a, gid);
  }
  if (!found) child_fail(126, "rollbox: cannot start command: unable to find group %s: no matching entries in /etc/group\n", group);
}

/* Becomes `spec`'s user: groups, then gid, then uid (after setuid nothing else may change).
 * Root's capabilities go with the uid. Returns the user's home. */
static const char *become_user(const char *spec, int tty_fd) {
  char user[MAX_USER_SPEC + 1];
  snprintf(user, sizeof user, "%s", spec);
  char *group = strchr(user, ':');
  if (group) *group++ = 0;
  struct account a;
  find_user(user, &a);
  find_groups(group, &a);
  /* The user's terminal is the user's (as login's grantpt makes it): mesg, write, a reopened /dev/pts/N. */
  if (tty_fd >= 0 && fchown(tty_fd, (uid_t)a.uid, (gid_t)-1) < 0) child_fail(126, "rollbox: cannot start command: chown of its terminal: %s\n", strerror(errno));
  if (setgroups(a.ngroups, a.groups) < 0) child_fail(126, "rollbox: cannot start command: setgroups: %s\n", strerror(errno));
  if (setgid((gid_t)a.gid) < 0) child_fail(126, "rollbox: cannot start command: setgid %lld: %s\n", a.gid, strerror(errno));
  if (setuid((uid_t)a.uid) < 0) child_fail(126, "rollbox: cannot start command: setuid %lld: %s\n", a.uid, strerror(errno));
  return a.home;
}

/* The request's env with HOME=home added, unless the request sets HOME itself: the base
 * environment's HOME (/root, say) is not the user's. */
static char **with_home(char **req, uint32_t *nreq, const char *home) {
  for (uint32_t i = 0; i < *nreq; i++)
    if (!strncmp(req[i], "HOME=", 5)) return req;
  char **out = calloc(*nreq + 2, sizeof *out);
  size_t len = strlen(home);
  char *entry = malloc(len + 6);
  if (!out || !entry) child_fail(255, "rollbox: cannot start command: out of memory\n");
  memcpy(out, req, *nreq * sizeof *out);
  memcpy(entry, "HOME=", 5);
  memcpy(entry + 5, home, len + 1);
  out[(*nreq)++] = entry;
  return out;
}

/* Between fork and exec: the command's stdio, session, fds, user, cwd, environment. */
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
  /* A pty command's terminal becomes its session's controlling terminal: job control,
   * ^C as SIGINT to the foreground group, SIGWINCH on a resize, /dev/tty. */
  int pty = (r->flags & SPAWN_PTY) != 0;
  if (pty && ioctl(0, TIOCSCTTY, 0) < 0) child_fail(255, "rollbox: cannot start command: TIOCSCTTY: %s\n", strerror(errno));
  /* Nothing of the init reaches the command: no socket, no cgroup directory. Closed
   * before chdir, so a cwd through /proc/self/fd/N finds nothing to climb out of. */
  close_from(3);
  /* Before chdir: the cwd is entered with the user's rights, not root's. Without a user the
   * command stays root with the init's groups. */
  char **envreq = r->envreq;
  uint32_t envc = r->envc;
  if (r->user) envreq = with_home(envreq, &envc, become_user(r->user, pty ? 0 : -1));
  if (chdir(r->cwd) < 0) child_fail(255, "rollbox: cannot start command: chdir to cwd (\"%s\"): %s\n", r->cwd, strerror(errno));
  char **envp = merge_env(envreq, envc);
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
