import fs from 'node:fs';

/** QEMU processes whose command line names a path under `root` (a test cluster's). */
export function qemuPidsUnder(root: string): number[] {
  const pids: number[] = [];
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmdline = fs.readFileSync(`/proc/${entry}/cmdline`, 'utf8');
      if (cmdline.startsWith('qemu-system') && cmdline.includes(root)) pids.push(Number(entry));
    } catch {
      /* gone */
    }
  }
  return pids;
}
