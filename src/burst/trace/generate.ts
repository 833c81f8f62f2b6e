import { TRACE_FORMAT, type TraceEvent, type TraceHeader } from '../../api/index.ts';
import { rngStream } from '../policy/index.ts';

/** Knobs of the synthetic trace; every rate is per second of trace time. */
export interface TraceGeneratorOptions {
  durationMs: number;
  seed: number;
  /** Mean arrival rate over a day, creates/s. */
  baseRatePerSecond: number;
  /** Diurnal swing: the rate runs from (1 - a) to (1 + a) times the base over 24 h. */
  diurnalAmplitude: number;
  /** Expected bursts per 24 h; each multiplies the rate for its duration. */
  burstsPerDay: number;
  burstMultiplier: number;
  burstDurationMs: number;
  /** Mean sandbox lifetime (exponential, floored at 1 s). */
  meanLifetimeMs: number;
  /** Share of creates whose layers are all in the synced set. */
  syncedShare: number;
  /** Share of creates that ask to stay local. */
  stayLocalShare: number;
  syncedLayers: string[];
  unsyncedLayers: string[];
  /** Resource shapes, drawn uniformly. */
  shapes: { cpuMillis: number; memoryMiB: number }[];
  tenants: number;
}

export const DEFAULT_TRACE_OPTIONS: TraceGeneratorOptions = {
  durationMs: 3_600_000,
  seed: 1,
  baseRatePerSecond: 3,
  diurnalAmplitude: 0.4,
  burstsPerDay: 12,
  burstMultiplier: 1.6,
  burstDurationMs: 600_000,
  meanLifetimeMs: 60_000,
  syncedShare: 0.7,
  stayLocalShare: 0.05,
  syncedLayers: ['busybox', 'python-3.12', 'node-20', 'swe-tools'],
  unsyncedLayers: ['cuda-12', 'rust-1.80', 'repo-cache-a', 'repo-cache-b'],
  shapes: [
    { cpuMillis: 1000, memoryMiB: 2048 },
    { cpuMillis: 2000, memoryMiB: 4096 },
    { cpuMillis: 1000, memoryMiB: 1024 },
    { cpuMillis: 4000, memoryMiB: 8192 },
  ],
  tenants: 4,
};

const DAY_MS = 86_400_000;

/**
 * A bursty synthetic trace: Poisson arrivals whose rate follows a diurnal sine (trough at
 * t = 0, peak at 12 h) times random bursts. Each concern draws from its own seeded
 * stream, so e.g. changing the burst count does not reshuffle the resource shapes.
 */
export function generateTrace(options: TraceGeneratorOptions): { header: TraceHeader; events: TraceEvent[] } {
  const o = options;
  const burstRandom = rngStream(o.seed, 'trace-bursts');
  const arrivalRandom = rngStream(o.seed, 'trace-arrivals');
  const shapeRandom = rngStream(o.seed, 'trace-shapes');

  const bursts: { startMs: number; endMs: number }[] = [];
  const expectedBursts = (o.burstsPerDay * o.durationMs) / DAY_MS;
  for (let i = 0, count = poisson(expectedBursts, burstRandom); i < count; i++) {
    const startMs = burstRandom() * o.durationMs;
    bursts.push({ startMs, endMs: startMs + o.burstDurationMs });
  }
  const rateAt = (ms: number) => {
    const diurnal = 1 - o.diurnalAmplitude * Math.cos((2 * Math.PI * ms) / DAY_MS);
    const inBurst = bursts.some((b) => ms >= b.startMs && ms < b.endMs);
    return o.baseRatePerSecond * diurnal * (inBurst ? o.burstMultiplier : 1);
  };

  const events: TraceEvent[] = [];
  for (let secondMs = 0; secondMs < o.durationMs; secondMs += 1000) {
    const count = poisson(rateAt(secondMs), arrivalRandom);
    const times = Array.from({ length: count }, () => secondMs + Math.floor(arrivalRandom() * Math.min(1000, o.durationMs - secondMs))).sort((a, b) => a - b);
    for (const atMs of times) events.push(makeEvent(atMs, o, shapeRandom));
  }
  const header: TraceHeader = {
    format: TRACE_FORMAT,
    version: 1,
    durationMs: o.durationMs,
    syncedLayers: o.syncedLayers,
    source: 'generator',
    seed: o.seed,
    options: { ...o, bursts: bursts.map((b) => ({ startMs: Math.round(b.startMs), endMs: Math.round(b.endMs) })) },
  };
  return { header, events };
}

function makeEvent(atMs: number, o: TraceGeneratorOptions, random: () => number): TraceEvent {
  const shape = pick(o.shapes, random);
  const base = o.syncedLayers[0] ?? 'busybox';
  const layers = [base];
  const synced = random() < o.syncedShare;
  const extra = o.syncedLayers.slice(1);
  if (extra.length > 0 && random() < 0.7) layers.push(pick(extra, random));
  if (!synced && o.unsyncedLayers.length > 0) layers.push(pick(o.unsyncedLayers, random));
  const event: TraceEvent = {
    atMs,
    cpuMillis: shape.cpuMillis,
    memoryMiB: shape.memoryMiB,
    layers,
    lifetimeMs: Math.max(1000, Math.round(-Math.log(1 - random()) * o.meanLifetimeMs)),
  };
  if (random() < o.stayLocalShare) event.stayLocal = true;
  if (o.tenants > 0) event.tenant = `t${Math.floor(random() * o.tenants)}`;
  return event;
}

function pick<T>(items: readonly T[], random: () => number): T {
  return items[Math.min(items.length - 1, Math.floor(random() * items.length))]!;
}

/** Poisson draw: Knuth's product method for small means, a rounded normal for large ones. */
function poisson(mean: number, random: () => number): number {
  if (mean <= 0) return 0;
  if (mean > 50) {
    const normal = Math.sqrt(-2 * Math.log(1 - random())) * Math.cos(2 * Math.PI * random());
    return Math.max(0, Math.round(mean + Math.sqrt(mean) * normal));
  }
  const limit = Math.exp(-mean);
  let k = 0;
  let product = random();
  while (product > limit) {
    k++;
    product *= random();
  }
  return k;
}
