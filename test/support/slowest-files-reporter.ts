import type { Reporter, TestModule } from 'vitest/node';

/**
 * Prints the slowest test files last, after the summary: CI keeps the end of the output, and
 * these are what decide whether the suite stays under its time budget.
 */
export default class SlowestFilesReporter implements Reporter {
  onTestRunEnd(testModules: ReadonlyArray<TestModule>): void {
    const rows = testModules
      .map((m) => ({ file: m.moduleId.replace(`${process.cwd()}/`, ''), seconds: m.diagnostic().duration / 1000 }))
      .sort((a, b) => b.seconds - a.seconds)
      .slice(0, 25);
    const total = testModules.reduce((sum, m) => sum + m.diagnostic().duration / 1000, 0);
    console.log(`\nslowest test files (of ${testModules.length}, ${total.toFixed(0)} s summed over files):`);
    for (const r of rows) console.log(`${r.seconds.toFixed(1).padStart(8)} s  ${r.file}`);
  }
}
