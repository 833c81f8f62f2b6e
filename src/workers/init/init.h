/*
 * Shared by the parts of rollbox-init (see rollbox-init.c for what it is and why):
 * the wire constants, spawn requests (spawn.c) and the keeper process (keeper.c).
 */
#ifndef ROLLBOX_INIT_H
#define ROLLBOX_INIT_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
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


enum {
  F_SPAWN = 1,
  F_STDIN = 2,
  F_STDIN_EOF = 3,
  F_ATTACH = 4, /* u64 from-offset, command id: replays the command's output, then live */
  F_SIGNAL = 5, /* i32 signal number, to the command's process group */
  F_FORGET = 6, /* its result is recorded: the init may drop it */
  F_RELEASE = 7, /* on a fresh connection: every durable command runs on detached, uncollected (a fork's child) */
  F_RESIZE = 8,  /* u16 cols, u16 rows: a pty command's window size (the kernel sends SIGWINCH) */
  F_STARTED = 16,
  F_STDOUT = 17,
  F_STDERR = 18,
  F_TRUNCATED = 19,
  F_EXIT = 20,
  F_ERROR = 21,
  F_ATTACHED = 22, /* u32 pid (0: not started), u32 exited, exec cgroup name */
  F_UNKNOWN = 23,  /* no durable command of that id (never spawned, forgotten or its grace ran out) */
  F_RELEASED = 24, /* u32: how many durable commands RELEASE let go of */
};

/* Between the init and a keeper (a SOCK_SEQPACKET pair: one message each). K_SPAWN carries
 * the SPAWN payload and the command's pipe ends (stdout, stderr, then stdin if it has one);
 * K_SPAWN_FILE the same with the payload in a memfd passed last (a large one). */
enum { K_SPAWN = 1, K_STARTED = 2, K_EXITED = 3, K_FAILED = 4, K_SPAWN_FILE = 5 };
#define KEEPER_INLINE_MAX (32u << 10)

enum { SPAWN_HAS_STDIN = 1, SPAWN_HAS_USER = 2, SPAWN_DURABLE = 4, SPAWN_PTY = 8 };
#define MAX_COMMAND_ID 128
/* A durable command's output frames stay in memory up to this, then in a spill file. */
#define LOG_MEM_BYTES (64u << 10)

#define LISTEN_FD 3
#define CGROUP_FD_FIRST 4
#define CGROUP_FDS 3
#define KEEPER_FD 3 /* in a keeper, its end of the pair */
#define HEADER_BYTES 8
#define MAX_FRAME_BYTES (16u << 20)
#define MAX_SESSIONS 1024
#define MAX_KEEPERS 256
#define MAX_SLOT_NAME 63
/* A SPAWN's slot "*": the init picks an idle exec cgroup, or makes one (a microVM's host
 * cannot see the guest's cgroups); the name it took comes back in ATTACHED. */
#define AUTO_SLOT "*"
/* A spawn's user (`name`, `uid`, `name:group`, `uid:gid`): the API allows 129 bytes. */
#define MAX_USER_SPEC 255
#define READ_CHUNK 65536
/* Past this many bytes queued for the worker, stop reading the command's output: the
 * command blocks on its pipe instead of the init's memory growing. */
#define OUT_HIGH_WATER (256u << 10)
/* Past this many bytes of stdin not yet taken by the command, stop reading the socket. */
#define IN_HIGH_WATER (256u << 10)


struct spawn_req {
  uint32_t flags;
  uint32_t cap_out, cap_err;
  int32_t oom_score_adj;
  const char *slot, *cwd;
  const char *user; /* NULL: as the init runs (root) */
  const char *id;   /* SPAWN_DURABLE: the command id; NULL otherwise */
  uint32_t grace_ms; /* SPAWN_DURABLE: how long it outlives its last connection */
  uint16_t cols, rows; /* SPAWN_PTY: the terminal's initial size */
  char **argv;   /* points into the payload */
  char **envreq; /* points into the payload */
  uint32_t argc, envc;
};

/* Directories of the sandbox's pids, freezer and memory cgroups (fds 4..6), or -1. */
extern int cgroup_fds[CGROUP_FDS];
extern char **environ;

void close_fd(int *fd);
/* Closes every fd from `first` up. */
void close_from(unsigned first);
void put_u32(char *p, uint32_t v);
uint32_t get_u32(const char *p);

/* Parses a SPAWN payload into r (pointing into it); NULL, or what is wrong with it. */
const char *parse_spawn(const char *p, size_t len, struct spawn_req *r);
void free_req(struct spawn_req *r);
/* Between fork and exec: the command's stdio, session, fds, user, cwd, environment; never
 * returns. With SPAWN_PTY, in_fd = out_fd = err_fd is the terminal's slave end: it becomes
 * the command's controlling terminal. */
__attribute__((noreturn)) void child_exec(const struct spawn_req *r, int in_fd, int out_fd, int err_fd);

/* Exec cgroups (slots.c): OOM kills counted in one, its process count (-1: none), making one. */
uint32_t slot_oom_kills(const char *slot);
int slot_population(const char *slot);
int slot_make(const char *slot);

/* A slot's keeper, in the process forked for it; never returns. */
__attribute__((noreturn)) void keeper_main(int fd, const char *slot);

#endif
