import type { BurstPolicy } from '../../api/index.ts';
import type { PlacementCandidate } from '../../queues/index.ts';
import { utilizationOf, type NodeUsage } from '../policy/index.ts';
import type { HostRecord, SharedState } from './state.ts';

export const CLOUD_POOL = 'cloud';
/** How long hosts terminated or forgotten are remembered (their last heartbeats must not look new). */
const RETIRED_KEEP_MS = 10 * 60_000;
/** A host that has not reported ready this long after provisioning is given up on. */
export const PROVISION_TIMEOUT_MS = 10 * 60_000;
/** How often the leader compares its hosts with the provider's list. */
export const LIST_EVERY_MS = 30_000;

/** Heartbeating and healthy within `lostAfterMs`. */
export function isAlive(c: PlacementCandidate | undefined, lostAfterMs: number): c is PlacementCandidate {
  return !!c && c.heartbeat.healthy && c.ageMs <= lostAfterMs;
}

export function usageOf(c: PlacementCandidate): NodeUsage {
  const hb = c.heartbeat;
  return {
    capacity: { cpuMillis: hb.capacity.cpuMillis, memoryMiB: hb.capacity.memoryMiB },
    requested: { cpuMillis: hb.used.cpuMillis, memoryMiB: hb.used.memoryMiB },
    measured: { cpuFraction: Math.min(1, hb.measured.cpuLoad), memoryFraction: hb.measured.memoryUsedFraction },
  };
}

/**
 * Local-pool utilization from the heartbeats, and the same with what the cloud runs now
 * counted as if it came home (the stop rule's view with `stopCountsCloudLoad`).
 */
export function observeLoad(candidates: readonly PlacementCandidate[], policy: BurstPolicy, config: { localPool: string; lostAfterMs: number }): { utilization: number; utilizationWithCloudLoad: number; localHosts: number } {
  const alive = candidates.filter((c) => isAlive(c, config.lostAfterMs));
  const localUsage = alive.filter((c) => c.heartbeat.pool === config.localPool).map(usageOf);
  const cloudLoad = { cpuMillis: 0, memoryMiB: 0 };
  const measured = policy.utilizationBasis === 'measured';
  for (const c of alive) {
    if (c.heartbeat.pool !== CLOUD_POOL) continue;
    const u = usageOf(c);
    cloudLoad.cpuMillis += measured ? u.measured.cpuFraction * u.capacity.cpuMillis : u.requested.cpuMillis;
    cloudLoad.memoryMiB += measured ? u.measured.memoryFraction * u.capacity.memoryMiB : u.requested.memoryMiB;
  }
  return { utilization: utilizationOf(localUsage, policy.utilizationBasis), utilizationWithCloudLoad: utilizationOf(localUsage, policy.utilizationBasis, cloudLoad), localHosts: localUsage.length };
}

export interface FleetStepInput {
  previous: Pick<SharedState, 'hosts' | 'retired'>;
  candidates: readonly PlacementCandidate[];
  /** The provider's machine ids when it was asked this tick (every LIST_EVERY_MS), else undefined. */
  listedProviderIds: ReadonlySet<string> | undefined;
  nowMs: number;
  lostAfterMs: number;
  /** How long a draining host stays before it is terminated (every gateway must have read the drain). */
  drainGraceMs: number;
}

export interface FleetStep {
  hosts: HostRecord[];
  retired: SharedState['retired'];
  /** Hosts to terminate now (at the provider), and why. */
  retire: { host: HostRecord; why: 'never became ready' | 'the provider no longer lists it' | 'vanished' | 'idle' }[];
}

/**
 * The cloud-host state machine, one tick of it, with no I/O: provisioning hosts become
 * ready once they heartbeat ready (or are given up on), vanished ones are forgotten,
 * drained ones are retired after the grace (unless a create raced the drain), and cloud
 * hosts operators started (no provider) join as ready.
 */
export function stepFleet(input: FleetStepInput): FleetStep {
  const { nowMs, lostAfterMs } = input;
  const alive = (c: PlacementCandidate | undefined): c is PlacementCandidate => isAlive(c, lostAfterMs);
  const byId = new Map(input.candidates.map((c) => [c.heartbeat.nodeId, c]));
  const retired = (input.previous.retired ?? []).filter((r) => nowMs - r.atMs < RETIRED_KEEP_MS);
  const retire: FleetStep['retire'] = [];
  const drop = (host: HostRecord, why: FleetStep['retire'][number]['why']) => {
    retired.push({ id: host.id, atMs: nowMs });
    retire.push({ host, why });
  };
  const hosts: HostRecord[] = [];
  for (const host of input.previous.hosts) {
    const c = byId.get(host.id);
    const sandboxes = c?.heartbeat.sandboxes ?? 0;
    if (host.state === 'provisioning') {
      if (alive(c) && c.heartbeat.ready !== false) hosts.push({ ...host, state: 'ready', sandboxes, idleSinceMs: sandboxes === 0 ? nowMs : null });
      else if (nowMs - host.provisionedAtMs > PROVISION_TIMEOUT_MS) drop(host, 'never became ready');
      else if (input.listedProviderIds && host.providerId !== null && !input.listedProviderIds.has(host.providerId) && nowMs - host.provisionedAtMs > LIST_EVERY_MS) drop(host, 'the provider no longer lists it');
      else hosts.push(host);
    } else if (!alive(c)) {
      // Vanished: the janitor ends its sandboxes failed(lost); the controller forgets it.
      drop(host, 'vanished');
    } else if (host.state === 'terminating') {
      if (sandboxes > 0) hosts.push({ ...host, state: 'ready', sandboxes, idleSinceMs: null, terminatingSinceMs: null }); // a create raced the drain
      else if (nowMs - host.terminatingSinceMs! >= input.drainGraceMs) drop(host, 'idle');
      else hosts.push(host);
    } else {
      hosts.push({ ...host, sandboxes, idleSinceMs: sandboxes > 0 ? null : (host.idleSinceMs ?? nowMs) });
    }
  }
  // Cloud hosts started by operators (no provider) are used, never terminated.
  const known = new Set([...hosts.map((h) => h.id), ...retired.map((r) => r.id)]);
  for (const c of input.candidates) {
    if (c.heartbeat.pool !== CLOUD_POOL || known.has(c.heartbeat.nodeId) || !alive(c) || c.heartbeat.ready === false) continue;
    hosts.push({ id: c.heartbeat.nodeId, providerId: null, state: 'ready', sandboxes: c.heartbeat.sandboxes, provisionedAtMs: nowMs, idleSinceMs: null, terminatingSinceMs: null });
  }
  return { hosts, retired, retire };
}
