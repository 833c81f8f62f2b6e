import path from 'node:path';
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../config/index.ts';
import { refuseOutsideBenchmarks, startHollowHosts } from './index.ts';

const REPO = path.resolve(import.meta.dirname, '../../..');

describe('hollow worker hosts', () => {
  it('refuse to start outside a benchmark: a test runner is not one', async () => {
    const config = loadConfig({}, {});
    // Refused before anything connects: the Redis named here does not exist.
    await expect(
      startHollowHosts({ count: 1, redisUrl: 'redis://127.0.0.1:1', config: config.node, capacity: { memoryMiB: 1024, cpuMillis: 1000, maxSandboxes: 10, maxStarting: 2 }, logger: pino({ level: 'silent' }) }),
    ).rejects.toThrow(/run only in benchmarks/);
  });

  it('accept only entry scripts under the repository bench/ folder', () => {
    expect(() => refuseOutsideBenchmarks(path.join(REPO, 'bench/scale.ts'))).not.toThrow();
    for (const entry of [path.join(REPO, 'bin/rollbox.js'), path.join(REPO, 'bench'), path.join(REPO, 'bench-other/x.ts'), path.join(REPO, 'bench/../src/cli/index.ts'), '/tmp/bench/scale.ts', undefined]) {
      expect(() => refuseOutsideBenchmarks(entry), String(entry)).toThrow(/run only in benchmarks/);
    }
  });
});
