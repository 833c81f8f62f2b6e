import type { Redis } from 'ioredis';
import { z } from 'zod';
import { TRACE_FORMAT, baseOf, type CreateSandboxRequest, type Sandbox, type TraceEvent, type TraceHeader } from '../../api/index.ts';
import { OPERATOR, keys, type LayerRegistry, type SandboxRegistry } from '../../registry/index.ts';

/** One create as the gateway saw it; the sandbox id lets the export find its lifetime. */
const RecordedCreate = z.object({
  atEpochMs: z.number(),
  sandboxId: z.string().optional(),
  cpuMillis: z.number(),
  memoryMiB: z.number(),
  layers: z.array(z.string()),
  stayLocal: z.boolean().optional(),
  tenant: z.string().optional(),
});
type RecordedCreate = z.infer<typeof RecordedCreate>;

/**
 * Appends every new create (accepted or refused) to a capped Redis stream, so
 * `rollbox burst record` can turn real traffic into a trace the simulator replays.
 */
export class TraceRecorder {
  constructor(private readonly redis: Redis, private readonly maxEvents: number) {}

  record(atEpochMs: number, tenant: string, request: CreateSandboxRequest, sandbox: Sandbox | undefined): void {
    if (this.maxEvents <= 0) return;
    const event: RecordedCreate = {
      atEpochMs,
      sandboxId: sandbox?.id,
      cpuMillis: request.resources.cpuMillis,
      memoryMiB: request.resources.memoryMiB,
      // Digests once resolved; a request refused before that keeps its refs (resolved at export).
      layers: sandbox?.layerDigests ?? [baseOf(request.image), ...request.image.layers],
      stayLocal: request.placement?.stayLocal || undefined,
      tenant,
    };
    // The stream's own id (the time of recording): creates end out of their arrival order,
    // and an id from the arrival time would be refused whenever a later arrival ended first
    // (most of a burst was lost that way). The arrival time is in the event.
    void this.redis.xadd(keys.burstTrace, 'MAXLEN', '~', String(this.maxEvents), '*', 'e', JSON.stringify(event)).catch(() => {});
  }
}

export interface ExportedTrace {
  header: TraceHeader;
  events: TraceEvent[];
  /** Events whose lifetime was unknown (refused, or never started) and got the median. */
  imputedLifetimes: number;
}

/**
 * The recorded creates since `sinceEpochMs` as a replayable trace: arrival relative to the
 * first event, lifetime from the sandbox record (end minus start; still running: now minus
 * start). A create that never ran has no lifetime of its own: it gets the median of the
 * others, since under another policy it might have run.
 */
export async function exportTrace(deps: { redis: Redis; registry: SandboxRegistry; layers: LayerRegistry; now: () => number }, sinceEpochMs: number): Promise<ExportedTrace> {
  const { redis } = deps;
  const recorded: RecordedCreate[] = [];
  for (let start = `${Math.max(0, Math.floor(sinceEpochMs))}-0`; ; ) {
    const batch = await redis.xrange(keys.burstTrace, start, '+', 'COUNT', 1000);
    for (const [, fields] of batch) {
      const parsed = RecordedCreate.safeParse(JSON.parse(fields[1] ?? 'null'));
      // Ids are recording times, never before arrival: an event recorded since may have arrived before.
      if (parsed.success && parsed.data.atEpochMs >= sinceEpochMs) recorded.push(parsed.data);
    }
    if (batch.length < 1000) break;
    start = `(${batch[batch.length - 1]![0]}`;
  }
  recorded.sort((a, b) => a.atEpochMs - b.atEpochMs);
  const nowMs = deps.now();
  const lifetimes = await Promise.all(recorded.map(async (r) => lifetimeOf(r.sandboxId ? await deps.registry.get(r.sandboxId) : undefined, nowMs)));
  const known = lifetimes.filter((l): l is number => l !== undefined).sort((a, b) => a - b);
  const median = known.length ? known[Math.floor(known.length / 2)]! : 0;
  const digestOf = new Map<string, string>();
  const resolve = async (ref: string) => {
    if (ref.startsWith('sha256:')) return ref;
    if (!digestOf.has(ref)) digestOf.set(ref, (await deps.layers.resolve(ref, OPERATOR).catch(() => undefined))?.digest ?? ref);
    return digestOf.get(ref)!;
  };
  const startMs = recorded[0]?.atEpochMs ?? sinceEpochMs;
  const events: TraceEvent[] = [];
  for (const [i, r] of recorded.entries()) {
    events.push({
      atMs: r.atEpochMs - startMs,
      cpuMillis: r.cpuMillis,
      memoryMiB: r.memoryMiB,
      layers: await Promise.all(r.layers.map(resolve)),
      lifetimeMs: lifetimes[i] ?? median,
      ...(r.stayLocal ? { stayLocal: true } : {}),
      ...(r.tenant ? { tenant: r.tenant } : {}),
    });
  }
  const syncedLayers = (await redis.smembers(keys.burstSyncedLayers)).sort();
  const header: TraceHeader = { format: TRACE_FORMAT, version: 1, startedAtEpochMs: startMs, durationMs: events.at(-1)?.atMs ?? 0, syncedLayers, source: 'recorder' };
  return { header, events, imputedLifetimes: lifetimes.filter((l) => l === undefined).length };
}

function lifetimeOf(sandbox: Sandbox | undefined, nowMs: number): number | undefined {
  const startedMs = Date.parse(sandbox?.startedAt ?? '');
  if (!sandbox || Number.isNaN(startedMs)) return undefined;
  const endedMs = Date.parse(sandbox.endedAt ?? '');
  return Math.max(0, (Number.isNaN(endedMs) ? nowMs : endedMs) - startedMs);
}
