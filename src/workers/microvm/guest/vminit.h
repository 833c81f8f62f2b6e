/*
 * rollbox-vminit: PID 1 of a rollbox microVM until it becomes rollbox-init (see stage0.c),
 * and the channel multiplexer it leaves behind (mux.c).
 */
#ifndef ROLLBOX_VMINIT_H
#define ROLLBOX_VMINIT_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * The multiplexed channel on the virtio-serial port, both ways: a 12-byte header (u32
 * channel, u8 kind, 3 zero bytes, u32 payload length, little-endian) and the payload.
 * The host opens a channel per connection to rollbox-init; on each, the bytes are
 * rollbox-init's own frames (src/workers/init/protocol.ts), relayed unchanged.
 */
enum {
  MUX_OPEN = 1,  /* host -> guest: connect a new channel to the init */
  MUX_DATA = 2,  /* bytes of the channel */
  MUX_EOF = 3,   /* the sender will write no more on the channel (half close) */
  MUX_CLOSE = 4, /* the channel is gone */
  MUX_PING = 5,  /* host -> guest, channel 0: answered by PONG (readiness) */
  MUX_PONG = 6,
  /*
   * host -> guest, channel 0, first thing after a restore: the channels of before the save
   * are gone (the new host end numbers its own from 1 again), then the host's wall clock
   * (u64 seconds, u32 nanoseconds) and 32 bytes of entropy: the guest's clock stood still
   * while the VM was saved, and its random state is the saved one.
   */
  MUX_RESTORED = 7,
  /*
   * Requests to the guest's trusted side itself (not to the init), each on a channel of
   * its own: the kind frame, the request's body as DATA frames, EOF. The answer: DATA
   * frames (a snapshot's tar), one RESULT, CLOSE. A CLOSE from the host cancels.
   */
  MUX_SNAPSHOT = 8, /* body: u32 mode, u32 max entries, excluded paths (each NUL-ended) */
  MUX_POLICY = 9,   /* body: the hidden paths wanted now, each NUL-ended (hide.c) */
  MUX_FREEZE = 10,  /* body: u8 1 freeze / 0 thaw the sandbox's processes (freeze.c) */
  MUX_RESULT = 11,  /* guest -> host: u32 status (0 ok), then the request's own answer */
  /*
   * host -> guest, channel 0, after RESTORED when the VM has a NIC: the address the waking
   * host leased it (u32 address and u32 gateway in network order around a u8 prefix and 3
   * zero bytes); answered by NET_DONE (u32 0, or the errno of what failed) before anything else.
   */
  MUX_NET = 12,
  MUX_NET_DONE = 13,
  /*
   * host -> guest, channel 0: who this VM is, before any command. At boot, and on each child
   * restored from a fork's image (the parent's memory, so the parent's name): u32 pids limit
   * for the sandbox (0: leave it), then the hostname (1-64 bytes). Answered by IDENTITY_DONE
   * (u32 0, or the errno of what failed).
   */
  MUX_IDENTITY = 14,
  MUX_IDENTITY_DONE = 15,
  /*
   * The clock after a restore, corrected for the time RESTORED waited to be read (seconds,
   * on a starved TCG guest): guest -> host, channel 0, TIME with u64 the guest's monotonic
   * nanoseconds; answered at once by TIME_IS: that u64 echoed, then the host's wall clock
   * (u64 seconds, u32 nanoseconds). The guest sets its clock to the host's plus half the
   * round trip, and asks again (a few times) while the round trip is long.
   */
  MUX_TIME = 16,
  MUX_TIME_IS = 17,
};
#define MUX_TIME_PAYLOAD_BYTES 8
#define MUX_TIME_IS_PAYLOAD_BYTES (8 + 8 + 4)
#define MUX_NET_PAYLOAD_BYTES 12
/* A request's body is read whole before it acts: two lists of 256 paths of 4096 bytes fit. */
#define MUX_MAX_REQUEST_BYTES (4u << 20)
#define MUX_RESTORED_PAYLOAD_BYTES (8 + 4 + 32)
#define MUX_HEADER_BYTES 12
#define MUX_MAX_PAYLOAD (64u << 10)
#define MUX_MAX_CHANNELS 1024

/* Where the init listens inside the VM: in the initramfs, which the sandbox cannot name. */
#define INIT_SOCKET_PATH "/run/rollbox-init.sock"

void vm_log(const char *fmt, ...);
__attribute__((noreturn)) void vm_die(const char *what);
/* `key=value` of the kernel command line into `val` (empty when absent). */
void vm_cmdline_str(const char *key, char *val, size_t len);
/* Loopback, and the NIC when the command line has rollbox.net= (net.c). */
void vm_net_setup(void);
/* A MUX_NET payload applied to eth0, the routes and the resolver; 0 or an errno (net.c). */
int vm_net_reconfigure(const char *payload, size_t len);
/* A MUX_IDENTITY payload: the hostname and the sandbox's pids limit; 0 or an errno (limits.c). */
int vm_set_identity(const char *payload, size_t len);
/*
 * The guest's cgroup2 tree (limits.c): /sandbox with the pids limit from rollbox.pids=,
 * PID 1 in /sandbox/init, the init's exec cgroups beside it; returns the directory the
 * init makes exec cgroups in.
 */
int vm_limits_setup(void);
/* The multiplexer's loop over the port `port_fd`; never returns. `root_fd`: the sandbox's root (O_PATH). */
__attribute__((noreturn)) void mux_main(int port_fd, int root_fd);
/* reclaim.c: the cold page cache reclaimed on `rollbox.reclaim=N` seconds; the poll timeout until the next round (-1: never). */
int vm_reclaim_timeout_ms(void);
/* Free page reporting's order from the command line (rollbox.reportorder=N), once virtio_balloon is loaded (reclaim.c). */
void vm_report_order_setup(void);

/*
 * The sandbox's cgroup (limits.c makes it): every process of the sandbox is below it, the
 * init in its child `init`, each command in an exec cgroup of its own (a0, a1, ...).
 */
#define SANDBOX_CGROUP "/sys/fs/cgroup/sandbox"
/* Freeze (and wait until every process below /sandbox is frozen) or thaw the sandbox: 0, or -1 with errno (freeze.c). */
int vm_freeze(int on);
/* Whether the sandbox is frozen (by a pause, or a request in progress). */
int vm_is_frozen(void);

/* Hidden paths (hide.c): `body` is the whole set wanted now; 0, or -1 with the reason in `err`. */
void hide_init(int root_fd);
int hide_apply(const char *body, size_t len, char *err, size_t errlen);

/*
 * A snapshot of the writable layer (snapshot.c), run in a child of the multiplexer: the
 * tar goes out as records on `sock` (a SOCK_SEQPACKET socket: 'D' + tar bytes, then one
 * 'R' + the result), read by the multiplexer as any channel. Never returns.
 */
enum { SNAP_STAGED = 1, SNAP_FROZEN = 2, SNAP_HELD = 3 };
__attribute__((noreturn)) void snapshot_main(int sock, const char *body, size_t len);
/* The stage of a snapshot that did not finish (its packer killed): its links hold the sandbox's disk space. */
void snapshot_clear_stage(void);
/* One record on a job's socket: a type byte and at most MUX_MAX_PAYLOAD bytes. */
#define JOB_RECORD_MAX (1 + MUX_MAX_PAYLOAD)

/* openat2(2) (musl has no wrapper and its headers lack the struct): paths resolved inside
 * the sandbox's tree, for hiding paths and walking a snapshot. */
#ifndef SYS_openat2
#define SYS_openat2 437
#endif
struct open_how_v0 {
  uint64_t flags, mode, resolve;
};
#define RESOLVE_NO_MAGICLINKS 0x02
#define RESOLVE_NO_SYMLINKS 0x04
#define RESOLVE_BENEATH 0x08
#define RESOLVE_IN_ROOT 0x10

#endif
