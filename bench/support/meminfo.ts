import { readFileSync } from 'node:fs';

/** The host's used memory, MiB: MemTotal - MemAvailable (page cache that can be dropped does not count). */
export function usedMiB(): number {
  const info = readFileSync('/proc/meminfo', 'utf8');
  const field = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(info)![1]) / 1024;
  return field('MemTotal') - field('MemAvailable');
}
