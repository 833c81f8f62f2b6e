import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';

/**
 * A program for sandboxes that holds memory: `memhold MIB LOG` fills MIB MiB with a
 * pseudo-random sequence (every page touched), keeps LOG open and appends to it, through
 * that one descriptor, the checksum of the whole buffer: once at start, then again at
 * each SIGUSR1. An unchanged checksum after a pause says the memory came back whole.
 */
const SOURCE = String.raw`
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static volatile sig_atomic_t asked;
static void on_usr1(int s) { (void)s; asked = 1; }
int main(int argc, char **argv) {
  if (argc < 3) return 2;
  size_t words = ((size_t)atoi(argv[1]) << 20) / 8;
  uint64_t *m = malloc(words * 8), x = 88172645463325252ULL;
  if (!m) return 1;
  for (size_t i = 0; i < words; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; m[i] = x; }
  int fd = open(argv[2], O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return 1;
  signal(SIGUSR1, on_usr1);
  for (;;) {
    uint64_t sum = 0;
    for (size_t i = 0; i < words; i++) sum = sum * 31 + m[i];
    dprintf(fd, "%016llx\n", (unsigned long long)sum);
    asked = 0;
    while (!asked) usleep(20000);
  }
}
`;

/** Builds memhold (static, musl) in `dir`; returns its path. */
export function buildMemhold(dir: string): string {
  const source = path.join(dir, 'memhold.c');
  const binary = path.join(dir, 'memhold');
  writeFileSync(source, SOURCE);
  execFileSync('musl-gcc', ['-static', '-O2', '-o', binary, source]);
  return binary;
}
