import { defineConfig } from 'vitest/config';

// Integration tests start their own redis-server and runc containers; the machine has
// two cores, so files run in a small fork pool and each test gets generous timeouts.
// The adversarial suite loads the host on purpose (fork bomb, floods, fills) and checks
// that a neighbour sandbox stays unaffected: it runs last, alone, so what it measures is
// its own load and not another file's.
const STRESS_FILES = ['test/adversarial.test.ts'];

export default defineConfig({
  test: {
    pool: 'forks',
    testTimeout: 60_000,
    hookTimeout: 60_000,
    reporters: ['default'],
    projects: [
      { extends: true, test: { name: 'main', include: ['src/**/*.test.ts', 'test/**/*.test.ts'], exclude: STRESS_FILES, maxWorkers: 2 } },
      { extends: true, test: { name: 'stress', include: STRESS_FILES, maxWorkers: 1, sequence: { groupOrder: 1 } } },
    ],
  },
});
