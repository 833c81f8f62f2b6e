/*
 * The guest's cold page cache, handed back (docs/microvm.md, "Memory the host gets back").
 * Free page reporting (virtio_balloon, loaded by stage0.c) gives the host the guest's free
 * pages; page cache is not free, and a guest kernel keeps what it once read for as long as
 * nothing else wants the memory. This guest kernel has no DAMON, so the multiplexer does
 * what DAMON_RECLAIM would: every `rollbox.reclaim=N` seconds it asks the sandbox's cgroup
 * to reclaim as many bytes as its LRU lists hold as inactive file pages (memory.reclaim,
 * cgroup2), i.e. cache not touched since it was last aged. Hot (active) cache stays, and
 * anonymous memory stays (the guest has no swap). What is reclaimed becomes free pages,
 * which the guest then reports.
 */
#define _GNU_SOURCE
#include "vminit.h"
#include <fcntl.h>
#include <time.h>

/* Less inactive cache than this is left alone: reclaim is not free either. */
#define RECLAIM_MIN_BYTES (2ull << 20)

static int interval_s = -1;
static struct timespec next_at;

static uint64_t inactive_file_bytes(void) {
  char buf[4096];
  int fd = open(SANDBOX_CGROUP "/memory.stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char *p = strstr(buf, "\ninactive_file ");
  return p ? strtoull(p + 15, NULL, 10) : 0;
}

static void reclaim_now(void) {
  uint64_t bytes = inactive_file_bytes();
  if (bytes < RECLAIM_MIN_BYTES) return;
  char amount[32];
  int len = snprintf(amount, sizeof amount, "%llu", (unsigned long long)bytes);
  int fd = open(SANDBOX_CGROUP "/memory.reclaim", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  /* EAGAIN: less could be reclaimed than asked (pages in use meanwhile); what was is gone. */
  if (write(fd, amount, (size_t)len) < 0 && errno != EAGAIN) vm_log("memory.reclaim: %s", strerror(errno));
  close(fd);
}

/*
 * The smallest free block the guest reports (2^N pages). The kernel sets it to the pageblock
 * order (9: 2 MiB) when virtio_balloon registers, overwriting a `page_reporting.` boot
 * parameter, so the init writes it once the module is loaded. It matters beyond the block
 * size: a zone is reported only while its free memory exceeds its low watermark plus 32
 * blocks of that order (64 MiB at order 9), so the 16 MiB DMA zone, where the compressed
 * kernel was unpacked from, is never reported at 9 and is at 5 (docs/microvm.md).
 */
void vm_report_order_setup(void) {
  char v[8];
  vm_cmdline_str("rollbox.reportorder", v, sizeof v);
  if (!v[0]) return;
  int fd = open("/sys/module/page_reporting/parameters/page_reporting_order", O_WRONLY | O_CLOEXEC);
  if (fd < 0 || write(fd, v, strlen(v)) < 0) vm_log("page_reporting_order: %s", strerror(errno));
  if (fd >= 0) close(fd);
}

int vm_reclaim_timeout_ms(void) {
  if (interval_s < 0) {
    char v[16];
    vm_cmdline_str("rollbox.reclaim", v, sizeof v);
    interval_s = v[0] ? atoi(v) : 0;
    clock_gettime(CLOCK_MONOTONIC, &next_at);
    next_at.tv_sec += interval_s;
  }
  if (interval_s <= 0) return -1;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  long long left_ms = (long long)(next_at.tv_sec - now.tv_sec) * 1000 + (next_at.tv_nsec - now.tv_nsec) / 1000000;
  if (left_ms > 0) return left_ms > 60000 ? 60000 : (int)left_ms;
  reclaim_now();
  clock_gettime(CLOCK_MONOTONIC, &next_at);
  next_at.tv_sec += interval_s;
  return interval_s * 1000;
}
