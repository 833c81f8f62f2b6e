/**
 * `rollbox burst generate | simulate | sweep`: tune the cloud-burst policy offline by
 * replaying create traces through the simulator (src/burst/sim) with the same policy
 * module the live controller uses.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Command } from 'commander';
import { BurstPolicy, type TraceEvent } from '../api/index.ts';
import { parseTtl } from '../iam/ttl.ts'; // the function alone: the IAM module brings Redis stores
// The trace's pure parts alone: the module's recorder brings Redis and the registry.
import { DEFAULT_TRACE_OPTIONS, generateTrace } from '../burst/trace/generate.ts';
import { readTraceFile, writeTraceFile } from '../burst/trace/file.ts';
import { progressBar } from '../report/index.ts';
import { SimModel, capStepRiseLine, capStepRises, runSweep, simulate, sweepCsv, sweepSvg, type SimResult } from '../burst/sim/index.ts';

/** `90s`, `10m`, `1h`, `1d`, a bare number of seconds, or 0. */
function durationMs(input: string): number {
  return input.trim() === '0' ? 0 : parseTtl(input) * 1000;
}

function numberList(input: string): number[] {
  const values = input.split(',').map((s) => Number(s.trim()));
  if (values.length === 0 || values.some((v) => !Number.isFinite(v))) throw new Error(`expected comma-separated numbers, got ${JSON.stringify(input)}`);
  return values;
}

function stringList(input: string): string[] {
  return input.split(',').map((s) => s.trim()).filter(Boolean);
}

function readJson(file: string): unknown {
  try {
    return JSON.parse(fs.readFileSync(file, 'utf8'));
  } catch (err) {
    throw new Error(`${file}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
  }
}

function parseOrExplain<T>(what: string, parse: () => T): T {
  try {
    return parse();
  } catch (err) {
    const issues = (err as { issues?: { path: PropertyKey[]; message: string }[] }).issues;
    throw new Error(`${what}: ${issues ? issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ') : String(err)}`, { cause: err });
  }
}

interface ModelFlags {
  model?: string;
  localNodes?: string;
  nodeCpuMillis?: string;
  nodeMemoryMib?: string;
  nodeMaxSandboxes?: string;
  heartbeat?: string;
  maxWait?: string;
  maxRefusals?: string;
  provisioningDelay?: string;
  syncDelay?: string;
  cloudWait?: string;
  syncedLayers?: string;
  seed?: string;
  policy?: string;
  progress?: boolean;
}

function addModelOptions(command: Command): Command {
  return command
    .option('--policy <file>', 'BurstPolicy JSON (missing fields take defaults)')
    .option('--model <file>', 'simulation model JSON (SimModel; flags below override it)')
    .option('--local-nodes <n>', 'local worker hosts (default 30)')
    .option('--node-cpu-millis <n>', 'CPU per local host, millicores (default 16000)')
    .option('--node-memory-mib <n>', 'memory per local host, MiB (default 65536)')
    .option('--node-max-sandboxes <n>', 'sandbox slots per local host (default 64)')
    .option('--heartbeat <duration>', 'heartbeat interval: snapshot staleness (default 1s)')
    .option('--max-wait <duration>', 'a create waiting longer gives up, counted refused (default 10m)')
    .option('--max-refusals <n>', 'node refusals before a create waits in the queue (default 3)')
    .option('--provisioning-delay <duration>', 'cloud VM boot time (default 90s)')
    .option('--sync-delay <duration>', 'cloud layer sync before ready (default 30s)')
    .option('--cloud-wait <duration>', 'a diverted create with no free cloud slot waits this long for one before going local (default 0: at once, as the live controller does)')
    .option('--synced-layers <list>', 'layers pre-synced to the cloud (default: the trace header list)')
    .option('--seed <n>', 'random seed (default 1)')
    .option('--progress', 'draw a progress bar on stderr even when it is not a terminal');
}

function loadInputs(flags: ModelFlags & { trace: string }) {
  const policy = parseOrExplain('policy', () => BurstPolicy.parse(flags.policy ? readJson(flags.policy) : {}));
  const base = flags.model ? (readJson(flags.model) as Record<string, unknown>) : {};
  const overrides: Record<string, unknown> = {
    localNodes: flags.localNodes && Number(flags.localNodes),
    nodeCpuMillis: flags.nodeCpuMillis && Number(flags.nodeCpuMillis),
    nodeMemoryMiB: flags.nodeMemoryMib && Number(flags.nodeMemoryMib),
    nodeMaxSandboxes: flags.nodeMaxSandboxes && Number(flags.nodeMaxSandboxes),
    heartbeatIntervalMs: flags.heartbeat && durationMs(flags.heartbeat),
    maxQueueWaitMs: flags.maxWait && durationMs(flags.maxWait),
    maxRefusals: flags.maxRefusals && Number(flags.maxRefusals),
    cloudProvisioningDelayMs: flags.provisioningDelay && durationMs(flags.provisioningDelay),
    cloudLayerSyncDelayMs: flags.syncDelay && durationMs(flags.syncDelay),
    cloudWaitMs: flags.cloudWait && durationMs(flags.cloudWait),
    syncedLayers: flags.syncedLayers && stringList(flags.syncedLayers),
    seed: flags.seed && Number(flags.seed),
  };
  for (const [key, value] of Object.entries(overrides)) if (value !== undefined && value !== '') base[key] = value;
  const model = parseOrExplain('model', () => SimModel.parse(base));
  const trace = readTraceFile(flags.trace);
  const synced = new Set(model.syncedLayers.length > 0 ? model.syncedLayers : (trace.header?.syncedLayers ?? []));
  if (synced.size === 0) process.stderr.write('rollbox burst: no synced layers (none in the trace header, no --synced-layers): nothing is eligible for the cloud\n');
  return { policy, model, events: trace.events, synced };
}

function resultTable(result: SimResult, events: readonly TraceEvent[]): string {
  const seconds = (ms: number) => `${(ms / 1000).toFixed(1)} s`;
  const rows: [string, string][] = [
    ['creates', String(result.creates)],
    ['trace span', seconds(events.length ? events[events.length - 1]!.atMs - events[0]!.atMs : 0)],
    ['started local / cloud', `${result.startedLocal} / ${result.startedCloud}`],
    ['overflow (not started locally at arrival)', String(result.overflow)],
    ['overflow absorbed by cloud', `${result.overflowAbsorbedByCloud} (${(result.overflowAbsorbedShare * 100).toFixed(1)}%)`],
    ['no local room at arrival', String(result.noLocalRoomAtArrival)],
    ['queue wait p50 / p99 / mean', `${seconds(result.queueWaitP50Ms)} / ${seconds(result.queueWaitP99Ms)} / ${seconds(result.queueWaitMeanMs)}`],
    ['waited at all', String(result.waited)],
    ['refused (gave up waiting)', String(result.refused)],
    ['diverted (fell back local)', `${result.diverted} (${result.divertedFellBackLocal})`],
    ['ineligible while diverting', String(result.ineligible)],
    ['diverting, share of time', `${(result.divertingTimeShare * 100).toFixed(1)}%`],
    ['local utilization mean / peak', `${result.meanUtilization} / ${result.peakUtilization}`],
    ['cloud VM-hours', String(result.cloudVmHours)],
    ['cloud hosts peak / provisioned', `${result.peakCloudHosts} / ${result.cloudProvisions}`],
  ];
  const width = Math.max(...rows.map(([k]) => k.length));
  return rows.map(([k, v]) => `${k.padEnd(width)}  ${v}`).join('\n');
}

export function registerBurstCommands(program: Command): void {
  const burst = program.command('burst').description('cloud burst: trace generator, policy simulator and sweep');

  burst
    .command('generate')
    .description('write a synthetic bursty create trace (JSON lines)')
    .requiredOption('--out <file>', 'trace file to write')
    .option('--duration <duration>', 'trace length: 1h, 1d, ...', '1h')
    .option('--seed <n>', 'random seed', '1')
    .option('--rate <perSecond>', 'mean creates per second', String(DEFAULT_TRACE_OPTIONS.baseRatePerSecond))
    .option('--diurnal <amplitude>', 'diurnal swing 0..1', String(DEFAULT_TRACE_OPTIONS.diurnalAmplitude))
    .option('--bursts-per-day <n>', 'expected bursts per 24 h', String(DEFAULT_TRACE_OPTIONS.burstsPerDay))
    .option('--burst-multiplier <x>', 'rate multiplier during a burst', String(DEFAULT_TRACE_OPTIONS.burstMultiplier))
    .option('--burst-duration <duration>', 'length of one burst', '10m')
    .option('--lifetime <duration>', 'mean sandbox lifetime (exponential)', '60s')
    .option('--synced-share <share>', 'share of creates whose layers are all synced', String(DEFAULT_TRACE_OPTIONS.syncedShare))
    .option('--stay-local-share <share>', 'share of creates asking to stay local', String(DEFAULT_TRACE_OPTIONS.stayLocalShare))
    .option('--synced-layers <list>', 'layer names in the synced set', DEFAULT_TRACE_OPTIONS.syncedLayers.join(','))
    .option('--unsynced-layers <list>', 'layer names outside it', DEFAULT_TRACE_OPTIONS.unsyncedLayers.join(','))
    .action((flags) => {
      const { header, events } = generateTrace({
        ...DEFAULT_TRACE_OPTIONS,
        durationMs: durationMs(flags.duration),
        seed: Number(flags.seed),
        baseRatePerSecond: Number(flags.rate),
        diurnalAmplitude: Number(flags.diurnal),
        burstsPerDay: Number(flags.burstsPerDay),
        burstMultiplier: Number(flags.burstMultiplier),
        burstDurationMs: durationMs(flags.burstDuration),
        meanLifetimeMs: durationMs(flags.lifetime),
        syncedShare: Number(flags.syncedShare),
        stayLocalShare: Number(flags.stayLocalShare),
        syncedLayers: stringList(flags.syncedLayers),
        unsyncedLayers: stringList(flags.unsyncedLayers),
      });
      fs.mkdirSync(path.dirname(path.resolve(flags.out)), { recursive: true });
      writeTraceFile(flags.out, header, events);
      process.stdout.write(`${JSON.stringify({ trace: flags.out, events: events.length, durationMs: header.durationMs, syncedLayers: header.syncedLayers })}\n`);
    });

  addModelOptions(
    burst
      .command('simulate')
      .description('replay a trace against the local and cloud pool model; prints a table, then one JSON line')
      .requiredOption('--trace <file>', 'trace file (JSON lines)'),
  ).action((flags) => {
    const { policy, model, events, synced } = loadInputs(flags);
    const bar = progressBar('simulating', { enabled: Boolean(flags.progress) || process.stderr.isTTY });
    const started = performance.now();
    const result = simulate(events, policy, model, synced, { onProgress: (f) => bar.update(f) });
    bar.done();
    process.stdout.write(`${resultTable(result, events)}\n`);
    process.stdout.write(`${JSON.stringify({ policy, model, result, wallMs: Math.round(performance.now() - started) })}\n`);
  });

  addModelOptions(
    burst
      .command('sweep')
      .description('simulate a grid of thresholds, hysteresis gaps and VM caps; writes DIR/sweep.csv and DIR/sweep.svg')
      .requiredOption('--trace <file>', 'trace file (JSON lines)')
      .requiredOption('--out <dir>', 'output directory')
      .option('--thresholds <list>', 'divertAboveUtilization values', '0.6,0.7,0.8,0.9,1')
      .option('--gaps <list>', 'hysteresis gaps (stopBelow = threshold - gap); the chart uses the first', '0.1,0.2')
      .option('--caps <list>', 'maxCloudHosts values', '0,4,16'),
  ).action((flags) => {
    const { policy, model, events, synced } = loadInputs(flags);
    const grid = { thresholds: numberList(flags.thresholds), gaps: numberList(flags.gaps), caps: numberList(flags.caps) };
    const bar = progressBar('sweep', { enabled: Boolean(flags.progress) || process.stderr.isTTY });
    const rows = runSweep(events, synced, policy, model, grid, (fraction, done, total) => bar.update(fraction, `${done}/${total} runs`));
    bar.done();
    fs.mkdirSync(flags.out, { recursive: true });
    const csvFile = path.join(flags.out, 'sweep.csv');
    const svgFile = path.join(flags.out, 'sweep.svg');
    fs.writeFileSync(csvFile, sweepCsv(rows));
    fs.writeFileSync(svgFile, sweepSvg(rows, grid.gaps[0]!, `${path.basename(flags.trace)}, ${events.length} creates`));
    // Queue wait need not fall with every added VM on a given trace (README, burst): say where it rose.
    const rises = capStepRises(rows);
    for (const rise of rises) process.stderr.write(`rollbox burst sweep: ${capStepRiseLine(rise)}\n`);
    process.stdout.write(`${JSON.stringify({ runs: rows.length, csv: csvFile, svg: svgFile, capStepsWhereWaitRose: rises.length })}\n`);
  });
}
