import { defineConfig } from 'vitest/config';

// Integration tests start their own redis-server and runc containers; the machine has
// two cores, so files run in a small fork pool and each test gets generous timeouts.
export default defineConfig({
  test: {
    include: ['src/**/*.test.ts', 'test/**/*.test.ts'],
    pool: 'forks',
    maxWorkers: 2,
    testTimeout: 60_000,
    hookTimeout: 60_000,
    reporters: ['default'],
  },
});
