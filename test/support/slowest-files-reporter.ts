import fs from 'node:fs';
import type { Reporter, TestModule } from 'vitest/node';
import { FILE_SECONDS_PATH } from './longest-first-sequencer.ts';

/**
 * Prints the slowest test files last, after the summary: CI keeps the end of the output, and
 * these are what decide whether the suite stays under its time budget. With
 * ROLLBOX_RECORD_FILE_SECONDS=1 it also writes every test file's seconds to
 * test/file-seconds.json, the order the longest-first sequencer starts files in.
 */
export default class SlowestFilesReporter implements Reporter {
  onTestRunEnd(testModules: ReadonlyArray<TestModule>): void {
    const rows = testModules
      .map((m) => ({ file: m.moduleId.replace(`${process.cwd()}/`, ''), seconds: m.diagnostic().duration / 1000 }))
      .sort((a, b) => b.seconds - a.seconds);
    const total = rows.reduce((sum, r) => sum + r.seconds, 0);
    console.log(`\nslowest test files (of ${testModules.length}, ${total.toFixed(0)} s summed over files):`);
    for (const r of rows.slice(0, 25)) console.log(`${r.seconds.toFixed(1).padStart(8)} s  ${r.file}`);
    if (process.env.ROLLBOX_RECORD_FILE_SECONDS === '1') {
      const lines = rows.filter((r) => r.file.startsWith('test/')).map((r) => `  ${JSON.stringify(r.file)}: ${Math.round(r.seconds)}`);
      fs.writeFileSync(FILE_SECONDS_PATH, `{\n${lines.join(',\n')}\n}\n`);
    }
  }
}
