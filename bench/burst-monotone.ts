/**
 * bench:burst-monotone — randomized search for traces on which more cloud capacity
 * (policy.maxCloudHosts) raises queue wait. Each case draws a trace (seed, load, shapes),
 * a model (the default 30 hosts, or the small 4-host one of the unit tests) and a policy,
 * replays it at caps 0,1,2,4,8,16 and records every cap step where p50, p99 or mean wait
 * rose, with what else differed (give-ups, mixed shapes, diversion time). Not a timing
 * bench: it measures the simulator's behaviour. Ends with one JSON line.
 *
 * Env: BENCH_CASES (default 120), BENCH_SEED (first case seed, default 1), BENCH_FAMILY
 * (all | default | small | uniform), BENCH_OUT (file for one JSON line per rise).
 * Heavy: run it at idle priority beside timing benches (chrt -i 0 nice -n 19).
 */
import fs from 'node:fs';
import { BurstPolicy, type TraceEvent } from '../src/api/index.ts';
import { SimModel, simulate, type SimResult } from '../src/burst/sim/index.ts';
import { rngStream } from '../src/burst/policy/index.ts';
import { DEFAULT_TRACE_OPTIONS, generateTrace, type TraceGeneratorOptions } from '../src/burst/trace/index.ts';
import { progressBar } from '../src/report/index.ts';

const CASES = Number(process.env.BENCH_CASES ?? 120);
const FIRST_SEED = Number(process.env.BENCH_SEED ?? 1);
const FAMILY = process.env.BENCH_FAMILY ?? 'all';
const OUT = process.env.BENCH_OUT;
const CAPS = [0, 1, 2, 4, 8, 16];
const METRICS = ['queueWaitP50Ms', 'queueWaitP99Ms', 'queueWaitMeanMs'] as const;
const ONE_SHAPE = [{ cpuMillis: 2000, memoryMiB: 4096 }];

interface Case {
  family: 'default' | 'small';
  seed: number;
  trace: TraceGeneratorOptions;
  model: SimModel;
  policy: Partial<BurstPolicy>;
  mixedShapes: boolean;
  giveUps: boolean;
}

/** One case from its seed: every knob drawn from its own stream, so the case replays alone. */
function drawCase(seed: number): Case {
  const r = rngStream(seed, 'monotone-case');
  const pick = <T>(items: readonly T[]): T => items[Math.floor(r() * items.length)]!;
  const family = FAMILY === 'default' || FAMILY === 'small' ? FAMILY : r() < 0.5 ? 'default' : 'small';
  const mixedShapes = FAMILY === 'uniform' ? false : r() < 0.7;
  const giveUps = r() < 0.7;
  const shapes = mixedShapes ? DEFAULT_TRACE_OPTIONS.shapes : ONE_SHAPE;
  // Loads from light to past saturation. Default pool: 30 x 16 cores, mean shape 2 cores,
  // 60 s lifetimes: about 4 creates/s fill it. Small pool: 4 hosts, about 0.53/s.
  const trace: TraceGeneratorOptions =
    family === 'default'
      ? { ...DEFAULT_TRACE_OPTIONS, seed, shapes, durationMs: pick([1_800_000, 3_600_000]), baseRatePerSecond: pick([1.5, 2.5, 3.5, 4, 4.5, 5.5, 7]), diurnalAmplitude: 0, burstsPerDay: pick([12, 48, 150]) }
      : { ...DEFAULT_TRACE_OPTIONS, seed, shapes, durationMs: 1_800_000, baseRatePerSecond: pick([0.3, 0.45, 0.55, 0.7, 0.9, 1.2, 1.8]), diurnalAmplitude: 0, burstsPerDay: 150 };
  const model = SimModel.parse({
    seed,
    maxQueueWaitMs: giveUps ? 600_000 : 86_400_000,
    ...(family === 'small' ? { localNodes: 4, cloudProvisioningDelayMs: 30_000, cloudLayerSyncDelayMs: 10_000 } : {}),
  });
  const threshold = pick([0.6, 0.7, 0.8, 0.9]);
  const policy: Partial<BurstPolicy> = {
    divertAboveUtilization: threshold,
    stopBelowUtilization: Math.round((threshold - pick([0.1, 0.2])) * 100) / 100,
    divertShare: pick([1, 1, 0.5]),
    stopCountsCloudLoad: r() < 0.85,
    maxProvisionsPerMinute: pick([2, 2, 8]),
  };
  return { family, seed, trace, model, policy, mixedShapes, giveUps };
}

interface Rise {
  seed: number;
  family: string;
  rate: number;
  creates: number;
  metric: string;
  capFrom: number;
  capTo: number;
  beforeMs: number;
  afterMs: number;
  relative: number;
  mixedShapes: boolean;
  /** Some create gave up at either cap. */
  gaveUp: boolean;
  /** The diverting time share differed between the two caps. */
  diversionChanged: boolean;
  p99AtMaxWait: boolean;
  policy: Partial<BurstPolicy>;
}

const rises: Rise[] = [];
let runs = 0;
let steps = 0;
const stepsBy: Record<string, number> = {};
const countStep = (key: string) => (stepsBy[key] = (stepsBy[key] ?? 0) + 1);
const bar = progressBar(`burst monotone (${FAMILY})`, { total: CASES });
const out = OUT ? fs.openSync(OUT, 'w') : undefined;
for (let i = 0; i < CASES; i++) {
  const c = drawCase(FIRST_SEED + i);
  const { header, events } = generateTrace(c.trace);
  const synced = new Set(header.syncedLayers);
  const results: SimResult[] = CAPS.map((cap) => simulate(events as TraceEvent[], BurstPolicy.parse({ ...c.policy, maxCloudHosts: cap }), c.model, synced));
  runs += CAPS.length;
  for (let k = 1; k < CAPS.length; k++) {
    const a = results[k - 1]!;
    const b = results[k]!;
    steps++;
    const gaveUp = a.refused > 0 || b.refused > 0;
    const classKey = `${c.family}/${c.mixedShapes ? 'mixed' : 'one-shape'}/${gaveUp ? 'give-ups' : 'no-give-ups'}`;
    countStep(classKey);
    for (const metric of METRICS) {
      if (b[metric] <= a[metric]) continue;
      const rise: Rise = {
        seed: c.seed,
        family: c.family,
        rate: c.trace.baseRatePerSecond,
        creates: events.length,
        metric,
        capFrom: CAPS[k - 1]!,
        capTo: CAPS[k]!,
        beforeMs: a[metric],
        afterMs: b[metric],
        relative: Math.round(((b[metric] - a[metric]) / Math.max(1, a[metric])) * 1e4) / 1e4,
        mixedShapes: c.mixedShapes,
        gaveUp,
        diversionChanged: a.divertingTimeShare !== b.divertingTimeShare,
        p99AtMaxWait: a.queueWaitP99Ms >= c.model.maxQueueWaitMs,
        policy: c.policy,
      };
      rises.push(rise);
      if (out !== undefined) fs.writeSync(out, `${JSON.stringify({ ...rise, classKey })}\n`);
    }
  }
  bar.tick();
}
bar.done();
if (out !== undefined) fs.closeSync(out);

/** Per class: cap steps checked, steps with any rise, and the largest rise of each metric. */
const classes: Record<string, { steps: number; stepsWithRise: number; maxRelative: Record<string, number>; maxAbsoluteMs: Record<string, number> }> = {};
for (const [key, count] of Object.entries(stepsBy)) classes[key] = { steps: count, stepsWithRise: 0, maxRelative: {}, maxAbsoluteMs: {} };
const seen = new Set<string>();
for (const rise of rises) {
  const key = `${rise.family}/${rise.mixedShapes ? 'mixed' : 'one-shape'}/${rise.gaveUp ? 'give-ups' : 'no-give-ups'}`;
  const entry = classes[key]!;
  const stepId = `${rise.seed}:${rise.capFrom}`;
  if (!seen.has(stepId)) {
    seen.add(stepId);
    entry.stepsWithRise++;
  }
  entry.maxRelative[rise.metric] = Math.max(entry.maxRelative[rise.metric] ?? 0, rise.relative);
  entry.maxAbsoluteMs[rise.metric] = Math.max(entry.maxAbsoluteMs[rise.metric] ?? 0, Math.round(rise.afterMs - rise.beforeMs));
}
for (const rise of rises) {
  process.stderr.write(
    `rise: seed ${rise.seed} ${rise.family} rate ${rise.rate} cap ${rise.capFrom}->${rise.capTo} ${rise.metric} ${rise.beforeMs} -> ${rise.afterMs} (+${(rise.relative * 100).toFixed(2)}%)${rise.mixedShapes ? ' mixed' : ''}${rise.gaveUp ? ' give-ups' : ''}${rise.diversionChanged ? ' diversion-changed' : ''}\n`,
  );
}
process.stdout.write(`${JSON.stringify({ bench: 'burst-monotone', family: FAMILY, firstSeed: FIRST_SEED, cases: CASES, runs, capSteps: steps, stepsWithRise: seen.size, rises: rises.length, classes })}\n`);
