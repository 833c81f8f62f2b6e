import { RollboxError, hasNetwork, reservationOf, type CreateSandboxRequest, type Resources, type Sandbox } from '../api/index.ts';
import type { PlacementCandidate, PlacementRequest } from '../queues/index.ts';

/** What placement needs of a sandbox's spec: what it reserves, and whether it has a network. */
export function placementOf(spec: Pick<CreateSandboxRequest, 'resources' | 'network' | 'tier'>): Omit<PlacementRequest, 'pool' | 'exclude'> {
  return { ...reservationOf(spec.resources), network: hasNetwork(spec.network), ...(spec.network.gateway ? { gateway: true } : {}), ...(spec.tier === 'microvm' ? { microvm: true } : {}) };
}

/**
 * What the microVM tier cannot do yet, refused before placement with the tier named
 * (its runtime refuses the same: src/workers/microvm/runtime.ts).
 */
export function checkTierSupports(spec: Pick<CreateSandboxRequest, 'tier' | 'resources' | 'network'>): void {
  if (spec.tier !== 'microvm') return;
  const missing = spec.resources.memoryMiB < 128 ? 'boot with less than 128 MiB of memory (resources.memoryMiB)' : spec.network.gateway ? "reach the gateway from inside (network.gateway)" : undefined;
  if (missing) throw new RollboxError('tier_unsupported', `the microvm tier cannot ${missing} yet (docs/microvm.md)`);
}

/** Requests a create left out, filled from the gateway's defaults (never above the limits): the record says what is reserved. */
export function withDefaultRequests<R extends Pick<Resources, 'cpuMillis' | 'memoryMiB' | 'requests'>>(resources: R, defaults: { memoryMiB: number; cpuMillis: number }): R & { requests: { memoryMiB: number; cpuMillis: number } } {
  return {
    ...resources,
    requests: {
      memoryMiB: resources.requests?.memoryMiB ?? Math.min(resources.memoryMiB, defaults.memoryMiB),
      cpuMillis: resources.requests?.cpuMillis ?? Math.min(resources.cpuMillis, defaults.cpuMillis),
    },
  };
}

/**
 * For a request no node took where one would have taken it without its network: the
 * hosts' failing self-tests (an allowlist network), or their probes finding no gateway
 * answering (an agent sandbox's `network.gateway`), are why, and the caller is told so.
 */
export function networkUnavailable(placement: PlacementRequest, candidates: readonly PlacementCandidate[], place: (p: PlacementRequest) => string | undefined): RollboxError | undefined {
  if (!placement.network || !place({ ...placement, network: false, gateway: false })) return undefined;
  const inPool = candidates.filter((c) => c.heartbeat.pool === placement.pool);
  if (placement.gateway && place({ ...placement, gateway: false })) {
    const cut = inPool.filter((c) => c.heartbeat.network?.gateway?.answering === false).map((c) => `${c.heartbeat.nodeId}: none of its gateways answered at ${new Date(c.heartbeat.network!.gateway!.checkedAtMs).toISOString()}${c.heartbeat.network!.gateway!.target ? ` (its rule still names ${c.heartbeat.network!.gateway!.target})` : ''}`);
    return new RollboxError('network_unavailable', `no worker host in pool ${placement.pool} reaches a gateway for an agent sandbox (network.gateway) now; their probes find none answering (${cut.join(' | ')})`, 5);
  }
  const failing = inPool.filter((c) => c.heartbeat.network?.allowlist === 'failing').map((c) => `${c.heartbeat.nodeId}: ${c.heartbeat.network!.detail ?? 'self-test failing'}`);
  return new RollboxError('network_unavailable', `no worker host in pool ${placement.pool} can give a sandbox an allowlist network now; their network self-tests fail (${failing.join(' | ')})`, 30);
}

/** Cloud burst routing and the create trace (src/burst); without it every create goes to the local pool. */
export interface CreateRouting {
  placeCreate(
    sandboxId: string,
    request: CreateSandboxRequest,
    layerDigests: readonly string[],
    local: PlacementRequest,
    place: (placement: PlacementRequest) => Promise<string | undefined>,
  ): Promise<{ placement: PlacementRequest; node: string | undefined }>;
  recordCreate(atEpochMs: number, tenant: string, request: CreateSandboxRequest, sandbox: Sandbox | undefined): void;
}
