import { defineConfig } from 'vitest/config';

// The Docker deployment tier (`npm run test:docker`): one file that installs Debian's Docker,
// builds images and runs wrangler-free-docker/compose.yaml, ~10-20 min on this kind of
// machine, so it is not part of `npm test` / .ci/run.
export default defineConfig({
  test: {
    include: ['test/docker/**/*.test.ts'],
    pool: 'forks',
    maxWorkers: 1,
    testTimeout: 20 * 60_000,
    hookTimeout: 40 * 60_000,
    reporters: ['default'],
  },
});
