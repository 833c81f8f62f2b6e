import { describe, expect, it } from 'vitest';
import { memoryCgroupKindFrom, parseProcSwaps } from './index.ts';

describe('swap pause mechanism', () => {
  it('chooses memory.reclaim where the cgroup has it (v2), memory.force_empty on v1, nothing elsewhere', () => {
    // This host's v1 memory cgroup (no memory.reclaim).
    const v1 = new Set(['cgroup.procs', 'memory.force_empty', 'memory.limit_in_bytes', 'memory.memsw.limit_in_bytes', 'memory.stat', 'memory.swappiness', 'memory.usage_in_bytes']);
    expect(memoryCgroupKindFrom(v1)).toBe('v1');
    // A v2 memory cgroup.
    const v2 = new Set(['cgroup.procs', 'memory.current', 'memory.max', 'memory.reclaim', 'memory.stat', 'memory.swap.current', 'memory.swap.max']);
    expect(memoryCgroupKindFrom(v2)).toBe('v2');
    expect(memoryCgroupKindFrom(new Set(['cgroup.procs', 'cpu.max']))).toBeUndefined();
  });

  it('reads /proc/swaps sizes in bytes, names with spaces unescaped', () => {
    const text = 'Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/data/worker/swapfile                   file\t\t409596\t\t266240\t\t-2\n/srv/my\\040swap file 1024 0 -3\n';
    expect(parseProcSwaps(text)).toEqual([
      { filename: '/data/worker/swapfile', sizeBytes: 409596 * 1024, usedBytes: 266240 * 1024 },
      { filename: '/srv/my swap', sizeBytes: 1024 * 1024, usedBytes: 0 },
    ]);
    expect(parseProcSwaps('Filename Type Size Used Priority\n')).toEqual([]);
  });
});
