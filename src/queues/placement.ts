import type { NodeHeartbeat } from '../api/index.ts';

/** Load placed on a node by this gateway that its heartbeat does not show yet. */
export interface AssumedLoad {
  memoryMiB: number;
  cpuMillis: number;
  sandboxes: number;
}

/** The heartbeat of a node with nothing on it yet (simulated nodes, test fixtures). */
export function idleHeartbeat(nodeId: string, pool: string, capacity: NodeHeartbeat['capacity'], atMs = 0): NodeHeartbeat {
  return {
    nodeId,
    pool,
    atMs,
    healthy: true,
    capacity,
    used: { cpuMillis: 0, memoryMiB: 0 },
    measured: { cpuLoad: 0, memoryUsedFraction: 0 },
    sandboxes: 0,
    starting: 0,
    cachedLayers: [],
    handledCreates: [],
  };
}

export interface PlacementCandidate {
  heartbeat: NodeHeartbeat;
  /** How long ago (by this gateway's clock) the heartbeat last changed. */
  ageMs: number;
  assumed: AssumedLoad;
}

export interface PlacementRequest {
  memoryMiB: number;
  cpuMillis: number;
  diskMiB?: number;
  pool: string;
  /** Nodes that refused this request already. */
  exclude: ReadonlySet<string>;
  /** Nodes not to place on (e.g. cloud hosts draining before termination). */
  avoid?: ReadonlySet<string>;
  /** The node must hold every one of these layers (a cloud host's synced set). */
  requiredLayers?: readonly string[];
  /** An allowlist network: only nodes whose network self-test passes (or that report none). */
  network?: boolean;
  /** An agent sandbox (`network.gateway`): not on nodes whose last probe found no gateway answering (heartbeat `network.gateway`). */
  gateway?: boolean;
  /** Only nodes that run the microVM tier (heartbeat `tiers.microvm`). */
  microvm?: boolean;
  /** Only this node (a fork's child whose disk is cloned from a fork point there). */
  only?: string;
}

export interface PlacementOptions {
  /** d in "power of d choices". */
  choices: number;
  staleAfterMs: number;
  random: () => number;
}

/** Below this share of the host's memory in real use, the measured figure does not steer placement. */
const MEASURED_MEMORY_COMFORT = 0.75;

/**
 * Load score in [0, inf): the most constrained of memory, CPU and slot reservations,
 * counting assumed (not yet reported) placements; and the host's measured memory use once
 * it is high. Lower is better. (Below the comfort level the measured figure, host-wide and
 * noisy, would otherwise outweigh the small reservations of idle sandboxes and send a
 * whole burst to one node.)
 */
export function loadScore(c: PlacementCandidate): number {
  const { capacity, used, sandboxes } = c.heartbeat;
  const memory = (used.memoryMiB + c.assumed.memoryMiB) / Math.max(1, capacity.memoryMiB);
  const cpu = (used.cpuMillis + c.assumed.cpuMillis) / Math.max(1, capacity.cpuMillis);
  const slots = (sandboxes + c.assumed.sandboxes) / Math.max(1, capacity.maxSandboxes);
  const measured = c.heartbeat.measured.memoryUsedFraction;
  return Math.max(memory, cpu, slots, measured > MEASURED_MEMORY_COMFORT ? measured : 0);
}

/** Nodes that could take the request at all: healthy, fresh, right pool, not excluded, with room. */
export function eligibleNodes(candidates: readonly PlacementCandidate[], request: PlacementRequest, staleAfterMs: number): PlacementCandidate[] {
  return candidates.filter((c) => {
    const hb = c.heartbeat;
    if (!hb.healthy || c.ageMs > staleAfterMs || hb.pool !== request.pool || request.exclude.has(hb.nodeId)) return false;
    if (hb.ready === false || request.avoid?.has(hb.nodeId) || !holdsLayers(hb, request.requiredLayers)) return false;
    if (request.network && hb.network && hb.network.allowlist !== 'ok') return false;
    if (request.gateway && hb.network?.gateway?.answering === false) return false;
    if (request.microvm && !hb.tiers?.microvm) return false;
    if (request.only !== undefined && hb.nodeId !== request.only) return false;
    const memoryFree = hb.capacity.memoryMiB - hb.used.memoryMiB - c.assumed.memoryMiB;
    const slotsFree = hb.capacity.maxSandboxes - hb.sandboxes - c.assumed.sandboxes;
    // Disk as the node last reported it (not counted in assumed load: the node's own
    // admission refuses a disk that no longer fits, and the request is placed again).
    const diskFree = (hb.capacity.diskMiB ?? Infinity) - (hb.used.diskMiB ?? 0);
    return memoryFree >= request.memoryMiB && slotsFree >= 1 && diskFree >= (request.diskMiB ?? 0);
  });
}

function holdsLayers(hb: NodeHeartbeat, layers: readonly string[] | undefined): boolean {
  if (!layers?.length) return true;
  const held = new Set([...hb.cachedLayers, ...(hb.syncedLayers ?? [])]);
  return layers.every((digest) => held.has(digest));
}

/**
 * Two-step placement, cluster side: filter, then sample `choices` distinct nodes at
 * random and take the less loaded one. Sampling (instead of argmin over the whole,
 * possibly stale snapshot) keeps a burst of concurrent requests from herding onto one node.
 */
export function chooseNode(candidates: readonly PlacementCandidate[], request: PlacementRequest, options: PlacementOptions): PlacementCandidate | undefined {
  const pool = eligibleNodes(candidates, request, options.staleAfterMs);
  if (pool.length === 0) return undefined;
  const picked: PlacementCandidate[] = [];
  const remaining = [...pool];
  while (picked.length < options.choices && remaining.length > 0) {
    const index = Math.min(remaining.length - 1, Math.floor(options.random() * remaining.length));
    picked.push(remaining.splice(index, 1)[0]!);
  }
  // Equal scores (small requests leave the host-wide measured memory as the score of every
  // node on one host): the one with fewer sandboxes, placed ones included.
  const sandboxesOf = (c: PlacementCandidate) => c.heartbeat.sandboxes + c.assumed.sandboxes;
  return picked.reduce((best, c) => {
    const [a, b] = [loadScore(c), loadScore(best)];
    return a < b || (a === b && sandboxesOf(c) < sandboxesOf(best)) ? c : best;
  });
}
