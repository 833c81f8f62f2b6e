import { RollboxError, type CreateSandboxRequest, type Sandbox } from '../api/index.ts';
import type { GatewayMetrics } from './metrics.ts';

/** Outcomes that tell burst routing the local pool could not take a create. */
const LOCAL_REFUSALS = ['no_capacity', 'admission_exhausted', 'timeout', 'node_lost'];

/** One create, counted by outcome and recorded in the burst trace (its arrival, what became of it). */
export async function countedCreate<T extends { sandbox: Sandbox; replayed: boolean }>(
  deps: { metrics: Pick<GatewayMetrics, 'creates' | 'seen'>; burst?: { recordCreate(atEpochMs: number, tenant: string, request: CreateSandboxRequest, sandbox: Sandbox | undefined): void }; now: () => number },
  tenant: string,
  request: CreateSandboxRequest,
  create: () => Promise<T>,
): Promise<T> {
  const { creates } = deps.metrics;
  const arrivedAtMs = deps.now();
  try {
    const outcome = await create();
    creates.inc({ outcome: outcome.replayed ? 'replayed' : outcome.sandbox.state });
    if (!outcome.replayed && outcome.sandbox.state === 'running') deps.metrics.seen.createAdmitted(deps.now() - arrivedAtMs);
    if (!outcome.replayed) deps.burst?.recordCreate(arrivedAtMs, tenant, request, outcome.sandbox);
    return outcome;
  } catch (err) {
    creates.inc({ outcome: err instanceof RollboxError ? err.code : 'internal' });
    if (err instanceof RollboxError) deps.metrics.seen.createRefused(err.code);
    if (err instanceof RollboxError && LOCAL_REFUSALS.includes(err.code)) deps.burst?.recordCreate(arrivedAtMs, tenant, request, undefined);
    throw err;
  }
}
