/**
 * bench:burst-sim — replays a generated day of one-second trace (about 270k creates)
 * through the burst simulator with the default policy and model. The floor is reading
 * and validating the same trace file, measured in the same run: any replay pays it.
 * Target: a day replays (read + simulate) in under a minute. Ends with one JSON line.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { BurstPolicy } from '../src/api/index.ts';
import { SimModel, simulate } from '../src/burst/sim/index.ts';
import { DEFAULT_TRACE_OPTIONS, generateTrace, readTraceFile, writeTraceFile } from '../src/burst/trace/index.ts';
import { progressBar } from '../src/report/index.ts';

const DURATION_MS = Number(process.env.BENCH_TRACE_SECONDS ?? 86_400) * 1000;
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rollbox-burst-bench-'));
try {
  const file = path.join(dir, 'day.jsonl');
  const generated = generateTrace({ ...DEFAULT_TRACE_OPTIONS, durationMs: DURATION_MS, seed: 1 });
  writeTraceFile(file, generated.header, generated.events);

  let started = performance.now();
  const { header, events } = readTraceFile(file);
  const readMs = performance.now() - started;

  const bar = progressBar('simulating a day');
  started = performance.now();
  const result = simulate(events, BurstPolicy.parse({}), SimModel.parse({}), new Set(header?.syncedLayers ?? []), { onProgress: (fraction) => bar.update(fraction) });
  const simulateMs = performance.now() - started;
  bar.done();

  const round = (x: number, digits = 2) => Math.round(x * 10 ** digits) / 10 ** digits;
  process.stderr.write(`read ${events.length} creates in ${round(readMs / 1000)} s; simulated ${result.events} events in ${round(simulateMs / 1000)} s\n`);
  process.stdout.write(
    `${JSON.stringify({
      bench: 'burst-sim',
      traceSeconds: DURATION_MS / 1000,
      creates: events.length,
      simEvents: result.events,
      readSeconds: round(readMs / 1000),
      simulateSeconds: round(simulateMs / 1000),
      totalSeconds: round((readMs + simulateMs) / 1000),
      simEventsPerSecond: Math.round(result.events / (simulateMs / 1000)),
      simulateVsReadFloor: round(simulateMs / readMs),
      underOneMinute: readMs + simulateMs < 60_000,
      queueWaitP99Ms: result.queueWaitP99Ms,
      cloudVmHours: result.cloudVmHours,
    })}\n`,
  );
} finally {
  fs.rmSync(dir, { recursive: true, force: true });
}
