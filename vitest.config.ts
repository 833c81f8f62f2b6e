import { defineConfig } from 'vitest/config';
import LongestFirstSequencer from './test/support/longest-first-sequencer.ts';

// Three tiers, as three projects:
// - unit: every test beside the code in src/ (no root, no Redis, no runc; `npm run test:unit`
//   runs just these, in seconds, on a machine without apt);
// - integration: test/, against a real redis-server and real runc containers (root);
// - stress: the adversarial suite, which loads the host on purpose (fork bomb, floods,
//   fills) and checks that a neighbour stays unaffected: it runs last, alone, so what it
//   measures is its own load and not another file's.
// The machine has two cores, so files run in a small fork pool with generous timeouts.
const STRESS_FILES = ['test/adversarial.test.ts'];
// The Docker deployment has its own tier and config (`npm run test:docker`, test/docker/).
const DOCKER_FILES = 'test/docker/**';

export default defineConfig({
  test: {
    pool: 'forks',
    testTimeout: 60_000,
    hookTimeout: 60_000,
    reporters: ['default', './test/support/slowest-files-reporter.ts'],
    // Longest files first (from the last recorded CI times): the suite ends with short files.
    sequence: { sequencer: LongestFirstSequencer },
    projects: [
      { extends: true, test: { name: 'unit', include: ['src/**/*.test.ts'], testTimeout: 20_000, maxWorkers: 2 } },
      { extends: true, test: { name: 'integration', include: ['test/**/*.test.ts'], exclude: [...STRESS_FILES, DOCKER_FILES], maxWorkers: 2 } },
      { extends: true, test: { name: 'stress', include: STRESS_FILES, maxWorkers: 1, sequence: { groupOrder: 1 } } },
    ],
  },
});
