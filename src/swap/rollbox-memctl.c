/*
 * rollbox-memctl: brings a paused sandbox's swapped-out memory back before it thaws.
 *
 *   rollbox-memctl prefetch PID...
 *
 * For each process: the mappings that hold swap (/proc/PID/smaps "Swap:") are advised
 * MADV_WILLNEED with process_madvise(2), which queues the reads of every swapped page at
 * once (anonymous memory and shmem alike); then each swapped anonymous page (pagemap bit
 * 62) is read one byte with process_vm_readv(2), which waits for its read and maps it
 * again, so the sandbox's first instructions after the thaw find their memory resident.
 * Prints "prefetched <bytes>" (pages it waited for). A process that exited meanwhile is
 * skipped. Needs CAP_SYS_NICE and CAP_SYS_PTRACE over the targets (the worker is root).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_process_madvise
#define SYS_process_madvise 440
#endif

#define BATCH 1024
#define PAGEMAP_SWAPPED (1ULL << 62)

struct range {
  uintptr_t start, end;
  int anon;
};

static long page_size;

/* Mappings of `pid` holding swap, from smaps: a header line starts a mapping, "Swap:" tells its swapped kB. */
static int swapped_ranges(int pid, struct range **out, size_t *count) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/smaps", pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t cap = 64, n = 0;
  struct range *r = malloc(cap * sizeof *r);
  struct range cur = {0, 0, 0};
  char line[4096];
  while (r && fgets(line, sizeof line, f)) {
    unsigned long a, b, inode;
    char perms[8], dev[16];
    int off = 0;
    if (sscanf(line, "%lx-%lx %7s %*s %15s %lu %n", &a, &b, perms, dev, &inode, &off) >= 5 && strchr(line, '-') < strchr(line, ' ')) {
      cur.start = a;
      cur.end = b;
      /* Private anonymous memory (heap, stacks, anonymous maps): its swap entries are in pagemap. */
      cur.anon = perms[3] == 'p' && inode == 0;
      continue;
    }
    unsigned long kb;
    if (sscanf(line, "Swap: %lu kB", &kb) == 1 && kb > 0 && cur.end > cur.start) {
      if (n == cap) {
        cap *= 2;
        struct range *grown = realloc(r, cap * sizeof *r);
        if (!grown) break;
        r = grown;
      }
      r[n++] = cur;
    }
  }
  fclose(f);
  if (!r) return -1;
  *out = r;
  *count = n;
  return 0;
}

static long advise_willneed(int pidfd, struct range *r, size_t n) {
  struct iovec iov[BATCH];
  long total = 0;
  for (size_t i = 0; i < n; i += BATCH) {
    size_t k = 0;
    for (; k < BATCH && i + k < n; k++) {
      iov[k].iov_base = (void *)r[i + k].start;
      iov[k].iov_len = r[i + k].end - r[i + k].start;
    }
    long done = syscall(SYS_process_madvise, pidfd, iov, k, MADV_WILLNEED, 0);
    if (done < 0) return -1;
    total += done;
  }
  return total;
}

/* One byte of each swapped anonymous page, read across: waits for its read, maps it again. */
static long touch_swapped(int pid, struct range *r, size_t n) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/pagemap", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  static uint64_t entries[4096];
  static char sink[BATCH];
  struct iovec local = {sink, 0}, remote[BATCH];
  size_t pending = 0;
  long touched = 0;
  for (size_t i = 0; i < n; i++) {
    if (!r[i].anon) continue;
    for (uintptr_t page = r[i].start; page < r[i].end;) {
      size_t want = (r[i].end - page) / page_size;
      if (want > 4096) want = 4096;
      ssize_t got = pread(fd, entries, want * 8, (off_t)(page / page_size) * 8);
      if (got <= 0) break;
      for (size_t e = 0; e < (size_t)got / 8; e++) {
        if (!(entries[e] & PAGEMAP_SWAPPED)) continue;
        remote[pending].iov_base = (void *)(page + e * page_size);
        remote[pending].iov_len = 1;
        if (++pending == BATCH) {
          local.iov_len = pending;
          if (process_vm_readv(pid, &local, 1, remote, pending, 0) > 0) touched += pending;
          pending = 0;
        }
      }
      page += (uintptr_t)(got / 8) * page_size;
    }
  }
  if (pending) {
    local.iov_len = pending;
    if (process_vm_readv(pid, &local, 1, remote, pending, 0) > 0) touched += pending;
  }
  close(fd);
  return touched * page_size;
}

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "prefetch") != 0) {
    fprintf(stderr, "usage: rollbox-memctl prefetch PID...\n");
    return 2;
  }
  page_size = sysconf(_SC_PAGESIZE);
  long total = 0;
  for (int a = 2; a < argc; a++) {
    int pid = atoi(argv[a]);
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) continue; /* exited */
    struct range *r = NULL;
    size_t n = 0;
    if (swapped_ranges(pid, &r, &n) == 0) {
      if (n > 0 && advise_willneed(pidfd, r, n) < 0 && errno != ESRCH) {
        fprintf(stderr, "rollbox-memctl: process_madvise(%d): %s\n", pid, strerror(errno));
        return 1;
      }
      long touched = touch_swapped(pid, r, n);
      if (touched > 0) total += touched;
      free(r);
    }
    close(pidfd);
  }
  printf("prefetched %ld\n", total);
  return 0;
}
