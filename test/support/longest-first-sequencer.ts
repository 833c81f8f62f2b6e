import fs from 'node:fs';
import path from 'node:path';
import { BaseSequencer, type TestSpecification } from 'vitest/node';

/**
 * Starts the test files that take longest first (test/file-seconds.json, seconds per file
 * from a CI run), so the suite's end is not one worker running a long file alone while the
 * other has nothing left. Vitest's own order needs a results cache a fresh clone does not
 * have, and falls back to file size, which put a 2-minute file with a short body last.
 * A file not listed yet counts as NEW_FILE_SECONDS. Refresh the list with
 * `ROLLBOX_RECORD_FILE_SECONDS=1 npm test` (the slowest-files reporter writes it).
 */
export const FILE_SECONDS_PATH = path.resolve(import.meta.dirname, '../file-seconds.json');
const NEW_FILE_SECONDS = 30;

export default class LongestFirstSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const known = readFileSeconds();
    const root = this.ctx.config.root;
    const secondsOf = (spec: TestSpecification) => {
      const file = path.relative(root, spec.moduleId);
      return known[file] ?? (file.startsWith('test/') ? NEW_FILE_SECONDS : 0);
    };
    return [...files].sort(
      (a, b) => a.project.config.sequence.groupOrder - b.project.config.sequence.groupOrder || secondsOf(b) - secondsOf(a),
    );
  }
}

export function readFileSeconds(): Record<string, number> {
  try {
    return JSON.parse(fs.readFileSync(FILE_SECONDS_PATH, 'utf8')) as Record<string, number>;
  } catch {
    return {};
  }
}
