/**
 * Discrete-event replay of a create trace against a model of the local pool and the
 * cloud pool, with the live controller's policy functions (src/burst/policy) making
 * every diversion and scaling decision. Pure: the trace and configuration come in, a
 * SimResult goes out; time is simulated and randomness is seeded.
 *
 * Modelled behaviour (the live controller does the same where it can):
 * - Every heartbeatIntervalMs the nodes report; placement (d-choice, src/queues) and the
 *   controller see only that snapshot plus the load this gateway placed since (assumed).
 * - Node admission (src/workers) is decided on the node's true state; a refusal re-places
 *   the create elsewhere, up to maxRefusals; then it waits in a FIFO queue that nodes
 *   pull from as capacity frees, until it starts or gives up after maxQueueWaitMs.
 * - A create the policy diverts goes to a ready cloud host with a free slot; with none
 *   free it falls back to local placement (and queue) at once, or after model.cloudWaitMs
 *   of waiting for a VM, and while it queues a cloud slot that frees may still take it.
 *   Diverted creates alive outside the cloud are the "pending diverted demand" that
 *   drives scale-up.
 * - Cloud hosts are ready cloudProvisioningDelayMs + cloudLayerSyncDelayMs after the
 *   provision call, have policy.cloudHostSandboxes slots, and are billed from provision
 *   to termination.
 * Random streams are split by concern and per create (placement), so diverting one
 * create never changes the random draws another create's placement sees.
 */
import type { BurstPolicy, TraceEvent } from '../../api/index.ts';
// The pure placement and admission functions, imported from their files so the simulator
// does not load the Redis and runc parts of those modules.
import { chooseNode, idleHeartbeat, type PlacementCandidate } from '../../queues/placement.ts';
import { decideAdmission, type AdmissionState } from '../../workers/admission.ts';
import { INITIAL_DIVERSION_STATE, decideCreate, mulberry32, planCloudScaling, rngStream, stepDiversion, utilizationOf, type NodeUsage } from '../policy/index.ts';
import { EventHeap } from './heap.ts';
import type { SimModel, SimResult } from './model.ts';

const END_LOCAL = 0;
const END_CLOUD = 1;
const TICK = 2;
const CLOUD_READY = 3;
const GIVE_UP = 4;
const CLOUD_WAIT_OVER = 5;

interface SimEvent {
  atMs: number;
  seq: number;
  kind: number;
  /** Create index, or cloud host index for CLOUD_READY. */
  id: number;
  /** Node or cloud host index. */
  where: number;
}

// Outcome of a create; 0 = not arrived yet.
const WAITING = 1;
/** Diverted, waiting for a cloud slot only (model.cloudWaitMs), before falling back to local. */
const WAITING_FOR_CLOUD = 5;
const STARTED_LOCAL = 2;
const STARTED_CLOUD = 3;
const REFUSED = 4;

interface CloudHost {
  id: string;
  /** Position in cloudHosts. */
  index: number;
  state: 'provisioning' | 'ready' | 'terminated';
  sandboxes: number;
  idleSinceMs: number | null;
  provisionedAtMs: number;
}

/** Creates waiting in arrival order; entries that started or gave up are skipped lazily. */
class WaitQueue {
  private items: number[] = [];
  private head = 0;
  constructor(private readonly isWaiting: (id: number) => boolean) {}

  push(id: number): void {
    this.items.push(id);
  }

  /** Calls visit on up to `limit` waiting entries from the front; visit returns false to stop. */
  scan(limit: number, visit: (id: number) => boolean): void {
    while (this.head < this.items.length && !this.isWaiting(this.items[this.head]!)) this.head++;
    if (this.head > 4096 && this.head * 2 > this.items.length) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
    let seen = 0;
    for (let j = this.head; j < this.items.length && seen < limit; j++) {
      const id = this.items[j]!;
      if (!this.isWaiting(id)) continue;
      seen++;
      if (!visit(id)) return;
    }
  }
}

/** Waiting entries a freed node looks at: enough to skip a head too big for it, bounded per release. */
const PULL_SCAN_LIMIT = 32;
const NO_EXCLUSIONS: ReadonlySet<string> = new Set();

export interface SimulateOptions {
  /** Called now and then with the share of arrivals replayed, 0..1. */
  onProgress?: (doneFraction: number) => void;
  /** Filled with each create's queue wait (trace order; a give-up counts maxQueueWaitMs), for per-create comparisons. */
  waitsMs?: Float64Array;
}

export function simulate(events: readonly TraceEvent[], policy: BurstPolicy, model: SimModel, syncedLayers: ReadonlySet<string>, options: SimulateOptions = {}): SimResult {
  const n = events.length;
  const heap = new EventHeap<SimEvent>();
  let seq = 0;
  let nowMs = 0;
  const schedule = (atMs: number, kind: number, id: number, where: number) => heap.push({ atMs, seq: seq++, kind, id, where });

  const shareRandom = rngStream(model.seed, 'divert-share');
  const placementSeed = rngStream(model.seed, 'placement')() * 4_294_967_296;

  // Local nodes: true state (admission) and the last heartbeat (placement, controller).
  const admission: AdmissionState[] = [];
  const candidates: PlacementCandidate[] = [];
  const usages: NodeUsage[] = [];
  const nodeIndex = new Map<string, number>();
  for (let i = 0; i < model.localNodes; i++) {
    const capacity = { cpuMillis: model.nodeCpuMillis, memoryMiB: model.nodeMemoryMiB, maxSandboxes: model.nodeMaxSandboxes };
    // Traces carry no diskMiB: the model's disks never run out.
    admission.push({ capacity, reserved: { cpuMillis: 0, memoryMiB: 0, diskMiB: 0 }, sandboxes: 0, hostFreeMemoryMiB: Infinity, hostReserveMiB: 0, disk: { capacityMiB: Infinity, freeMiB: Infinity, sizeMiB: Infinity } });
    const nodeId = `local-${i}`;
    nodeIndex.set(nodeId, i);
    candidates.push({
      ageMs: 0,
      assumed: { cpuMillis: 0, memoryMiB: 0, sandboxes: 0 },
      heartbeat: idleHeartbeat(nodeId, 'local', { ...capacity, maxStarting: model.nodeMaxSandboxes }),
    });
    usages.push({ capacity: { cpuMillis: capacity.cpuMillis, memoryMiB: capacity.memoryMiB }, requested: { cpuMillis: 0, memoryMiB: 0 }, measured: { cpuFraction: 0, memoryFraction: 0 } });
  }

  const cloudHosts: CloudHost[] = [];
  let liveCloudHosts: CloudHost[] = [];
  /** Requested resources of the sandboxes running in the cloud. */
  const cloudLoad = { cpuMillis: 0, memoryMiB: 0 };
  const provisionTimesMs: number[] = [];
  let provisionWindowStart = 0;
  let cloudVmMs = 0;
  let peakCloudHosts = 0;

  const outcome = new Uint8Array(n);
  const waitMs = new Float64Array(n);
  /** Diverted but not (yet) in the cloud: counted in the pending diverted demand. */
  const divertedOutsideCloud = new Uint8Array(n);
  let pendingDivertedDemand = 0;
  let waiting = 0;
  let running = 0;
  const counts = { diverted: 0, divertedFellBackLocal: 0, overflow: 0, noLocalRoomAtArrival: 0 };
  const byReason: Record<string, number> = { not_diverting: 0, stay_local: 0, layers_not_synced: 0, share: 0, diverted: 0 };

  let diversion = INITIAL_DIVERSION_STATE;
  let ticksDuringTrace = 0;
  let divertingTicks = 0;
  let utilizationSum = 0;
  let peakUtilization = 0;

  const localQueue = new WaitQueue((id) => outcome[id] === WAITING);
  const cloudQueue = new WaitQueue((id) => outcome[id] === WAITING || outcome[id] === WAITING_FOR_CLOUD);

  const leaveDivertedDemand = (id: number) => {
    if (divertedOutsideCloud[id]) {
      divertedOutsideCloud[id] = 0;
      pendingDivertedDemand--;
    }
  };

  const markStarted = (id: number, how: number) => {
    if (outcome[id] === WAITING || outcome[id] === WAITING_FOR_CLOUD) waiting--;
    outcome[id] = how;
    waitMs[id] = nowMs - events[id]!.atMs;
    running++;
  };

  const startLocal = (id: number, node: number) => {
    const event = events[id]!;
    const state = admission[node]!;
    state.reserved.cpuMillis += event.cpuMillis;
    state.reserved.memoryMiB += event.memoryMiB;
    state.sandboxes++;
    markStarted(id, STARTED_LOCAL);
    schedule(nowMs + event.lifetimeMs, END_LOCAL, id, node);
  };

  const startCloud = (id: number, hostIndex: number) => {
    const host = cloudHosts[hostIndex]!;
    host.sandboxes++;
    host.idleSinceMs = null;
    cloudLoad.cpuMillis += events[id]!.cpuMillis;
    cloudLoad.memoryMiB += events[id]!.memoryMiB;
    markStarted(id, STARTED_CLOUD);
    leaveDivertedDemand(id);
    schedule(nowMs + events[id]!.lifetimeMs, END_CLOUD, id, hostIndex);
  };

  /** The ready host with a free slot that is fullest: packing lets the others idle out. */
  const cloudHostWithSlot = (): number => {
    let best: CloudHost | undefined;
    for (const host of liveCloudHosts) {
      if (host.state !== 'ready' || host.sandboxes >= policy.cloudHostSandboxes) continue;
      if (best === undefined || host.sandboxes > best.sandboxes) best = host;
    }
    return best?.index ?? -1;
  };

  /** Each create's own placement stream: what other creates did never shifts its draws. */
  const placementRandomOf = (id: number) => mulberry32((placementSeed + Math.imul(id, 0x9e3779b1)) >>> 0);

  const placeLocal = (id: number, random: () => number): boolean => {
    const event = events[id]!;
    let exclude = NO_EXCLUSIONS;
    for (let refusals = 0; ; ) {
      const chosen = chooseNode(candidates, { memoryMiB: event.memoryMiB, cpuMillis: event.cpuMillis, pool: 'local', exclude }, { choices: model.placementChoices, staleAfterMs: Infinity, random });
      if (chosen === undefined) return false;
      const node = nodeIndex.get(chosen.heartbeat.nodeId)!;
      if (decideAdmission(admission[node]!, event).admit) {
        chosen.assumed.cpuMillis += event.cpuMillis;
        chosen.assumed.memoryMiB += event.memoryMiB;
        chosen.assumed.sandboxes++;
        startLocal(id, node);
        return true;
      }
      if (++refusals > model.maxRefusals) return false;
      if (exclude === NO_EXCLUSIONS) exclude = new Set();
      (exclude as Set<string>).add(chosen.heartbeat.nodeId);
    }
  };

  const pulledSinceTick = new Uint8Array(model.localNodes);
  const pullLocal = (node: number) => {
    const state = admission[node]!;
    pulledSinceTick[node] = 1;
    localQueue.scan(PULL_SCAN_LIMIT, (id) => {
      if (decideAdmission(state, events[id]!).admit) startLocal(id, node);
      return state.sandboxes < state.capacity.maxSandboxes;
    });
  };

  const pullCloud = (hostIndex: number) => {
    const host = cloudHosts[hostIndex]!;
    if (host.state !== 'ready') return;
    cloudQueue.scan(policy.cloudHostSandboxes, (id) => {
      startCloud(id, hostIndex);
      return host.sandboxes < policy.cloudHostSandboxes;
    });
  };

  const arrive = (id: number) => {
    route(id);
    if (outcome[id] !== STARTED_LOCAL) counts.overflow++;
  };

  const route = (id: number) => {
    const event = events[id]!;
    // Drawn for every create, diverting or not, so the streams stay aligned across policies.
    const shareDraw = shareRandom();
    const placementRandom = placementRandomOf(id);
    if (!admission.some((state) => decideAdmission(state, event).admit)) counts.noLocalRoomAtArrival++;
    const decision = decideCreate(diversion, event, syncedLayers, shareDraw, policy);
    byReason[decision.reason]!++;
    if (decision.target === 'cloud') {
      counts.diverted++;
      const host = cloudHostWithSlot();
      if (host >= 0) return startCloud(id, host);
      divertedOutsideCloud[id] = 1;
      pendingDivertedDemand++;
      if (model.cloudWaitMs > 0 && cloudPoolCanGrow()) {
        outcome[id] = WAITING_FOR_CLOUD;
        waiting++;
        cloudQueue.push(id);
        schedule(nowMs + model.maxQueueWaitMs, GIVE_UP, id, 0);
        schedule(nowMs + model.cloudWaitMs, CLOUD_WAIT_OVER, id, 0);
        return;
      }
      counts.divertedFellBackLocal++;
      placeOrQueueLocal(id, placementRandom, true);
      return;
    }
    placeOrQueueLocal(id, placementRandom, false);
  };

  /** As the live controller judges it: a host is on its way, or one may still be started. */
  const cloudPoolCanGrow = () => liveCloudHosts.some((h) => h.state === 'provisioning') || liveCloudHosts.length < policy.maxCloudHosts;

  const placeOrQueueLocal = (id: number, random: () => number, cloudMayTakeIt: boolean) => {
    if (placeLocal(id, random)) return;
    if (outcome[id] !== WAITING_FOR_CLOUD) {
      waiting++;
      schedule(events[id]!.atMs + model.maxQueueWaitMs, GIVE_UP, id, 0);
    }
    outcome[id] = WAITING;
    localQueue.push(id);
    if (cloudMayTakeIt) cloudQueue.push(id);
  };

  const heartbeat = () => {
    for (let i = 0; i < candidates.length; i++) {
      const { reserved, sandboxes, capacity } = admission[i]!;
      const candidate = candidates[i]!;
      const hb = candidate.heartbeat;
      hb.atMs = nowMs;
      hb.used.cpuMillis = reserved.cpuMillis;
      hb.used.memoryMiB = reserved.memoryMiB;
      hb.sandboxes = sandboxes;
      hb.measured.cpuLoad = (model.measuredShareOfRequest * reserved.cpuMillis) / capacity.cpuMillis;
      hb.measured.memoryUsedFraction = (model.measuredShareOfRequest * reserved.memoryMiB) / capacity.memoryMiB;
      // The heartbeat shows everything placed so far: nothing is assumed any more.
      candidate.assumed.cpuMillis = 0;
      candidate.assumed.memoryMiB = 0;
      candidate.assumed.sandboxes = 0;
      const usage = usages[i]!;
      usage.requested.cpuMillis = reserved.cpuMillis;
      usage.requested.memoryMiB = reserved.memoryMiB;
      usage.measured.cpuFraction = hb.measured.cpuLoad;
      usage.measured.memoryFraction = hb.measured.memoryUsedFraction;
    }
  };

  const scaleCloud = () => {
    while (provisionWindowStart < provisionTimesMs.length && provisionTimesMs[provisionWindowStart]! <= nowMs - 60_000) provisionWindowStart++;
    const plan = planCloudScaling(
      {
        cloudHosts: liveCloudHosts.map((h) => ({ id: h.id, state: h.state === 'ready' ? 'ready' : 'provisioning', sandboxes: h.sandboxes, idleSinceMs: h.idleSinceMs })),
        pendingDivertedDemand,
        provisionsInLastMinute: provisionTimesMs.length - provisionWindowStart,
        nowMs,
      },
      policy,
    );
    if (plan.terminate.length > 0) {
      const ending = new Set(plan.terminate);
      for (const host of liveCloudHosts) {
        if (!ending.has(host.id)) continue;
        host.state = 'terminated';
        cloudVmMs += nowMs - host.provisionedAtMs;
      }
      liveCloudHosts = liveCloudHosts.filter((h) => h.state !== 'terminated');
    }
    for (let k = 0; k < plan.provision; k++) {
      const host: CloudHost = { id: `cloud-${cloudHosts.length}`, index: cloudHosts.length, state: 'provisioning', sandboxes: 0, idleSinceMs: null, provisionedAtMs: nowMs };
      cloudHosts.push(host);
      liveCloudHosts.push(host);
      provisionTimesMs.push(nowMs);
      schedule(nowMs + model.cloudProvisioningDelayMs + model.cloudLayerSyncDelayMs, CLOUD_READY, host.index, host.index);
    }
    peakCloudHosts = Math.max(peakCloudHosts, liveCloudHosts.length);
  };

  let nextArrival = 0;
  const tick = () => {
    heartbeat();
    const utilization = utilizationOf(usages, policy.utilizationBasis);
    const share = policy.utilizationBasis === 'measured' ? model.measuredShareOfRequest : 1;
    const utilizationWithCloudLoad = utilizationOf(usages, policy.utilizationBasis, { cpuMillis: share * cloudLoad.cpuMillis, memoryMiB: share * cloudLoad.memoryMiB });
    diversion = stepDiversion(diversion, utilization, nowMs, policy, utilizationWithCloudLoad);
    if (nextArrival < n) {
      ticksDuringTrace++;
      utilizationSum += utilization;
      peakUtilization = Math.max(peakUtilization, utilization);
      if (diversion.diverting) divertingTicks++;
    }
    scaleCloud();
    // Nodes pull when a sandbox ends; one that had no end since the last tick (idle, or
    // room that appeared before a create queued) pulls here so nothing waits on it forever.
    for (let node = 0; node < admission.length && waiting > 0; node++) if (!pulledSinceTick[node]) pullLocal(node);
    pulledSinceTick.fill(0);
    const provisioning = liveCloudHosts.some((h) => h.state === 'provisioning');
    if (nextArrival < n || waiting > 0 || running > 0 || provisioning) schedule(nowMs + model.heartbeatIntervalMs, TICK, 0, 0);
  };

  const handle = (event: SimEvent) => {
    switch (event.kind) {
      case END_LOCAL: {
        const state = admission[event.where]!;
        const create = events[event.id]!;
        state.reserved.cpuMillis -= create.cpuMillis;
        state.reserved.memoryMiB -= create.memoryMiB;
        state.sandboxes--;
        running--;
        leaveDivertedDemand(event.id);
        pullLocal(event.where);
        break;
      }
      case END_CLOUD: {
        const host = cloudHosts[event.where]!;
        host.sandboxes--;
        cloudLoad.cpuMillis -= events[event.id]!.cpuMillis;
        cloudLoad.memoryMiB -= events[event.id]!.memoryMiB;
        running--;
        if (host.sandboxes === 0) host.idleSinceMs = nowMs;
        pullCloud(event.where);
        break;
      }
      case CLOUD_READY: {
        const host = cloudHosts[event.where]!;
        if (host.state !== 'provisioning') break;
        host.state = 'ready';
        host.idleSinceMs = nowMs;
        pullCloud(event.where);
        break;
      }
      case CLOUD_WAIT_OVER:
        if (outcome[event.id] !== WAITING_FOR_CLOUD) break;
        counts.divertedFellBackLocal++;
        placeOrQueueLocal(event.id, placementRandomOf(event.id), true);
        break;
      case GIVE_UP:
        if (outcome[event.id] !== WAITING && outcome[event.id] !== WAITING_FOR_CLOUD) break;
        outcome[event.id] = REFUSED;
        waitMs[event.id] = model.maxQueueWaitMs;
        waiting--;
        leaveDivertedDemand(event.id);
        break;
      case TICK:
        tick();
        break;
    }
  };

  const progressEvery = Math.max(1, Math.floor(n / 200));
  let handled = 0;
  schedule(events[0]?.atMs ?? 0, TICK, 0, 0);
  for (;;) {
    const top = heap.peek();
    const arrivalAtMs = nextArrival < n ? events[nextArrival]!.atMs : Infinity;
    if (top === undefined && arrivalAtMs === Infinity) break;
    handled++;
    // At equal times, releases and heartbeats come before the arrival.
    if (top !== undefined && top.atMs <= arrivalAtMs) {
      heap.pop();
      nowMs = top.atMs;
      handle(top);
    } else {
      nowMs = arrivalAtMs;
      arrive(nextArrival++);
      if (nextArrival % progressEvery === 0) options.onProgress?.(nextArrival / n);
    }
  }
  options.onProgress?.(1);

  // Hosts still up at the end would idle out after idleTerminateMs: bill them until then.
  for (const host of liveCloudHosts) cloudVmMs += Math.max(nowMs, (host.idleSinceMs ?? nowMs) + policy.idleTerminateMs) - host.provisionedAtMs;

  options.waitsMs?.set(waitMs.subarray(0, Math.min(n, options.waitsMs.length)));
  const sorted = waitMs.slice().sort();
  const percentile = (p: number) => (n === 0 ? 0 : sorted[Math.min(n - 1, Math.max(0, Math.ceil((p / 100) * n) - 1))]!);
  let startedLocal = 0;
  let startedCloud = 0;
  let refused = 0;
  let waited = 0;
  let waitSum = 0;
  for (let i = 0; i < n; i++) {
    if (outcome[i] === STARTED_LOCAL) startedLocal++;
    else if (outcome[i] === STARTED_CLOUD) startedCloud++;
    else if (outcome[i] === REFUSED) refused++;
    if (waitMs[i]! > 0) waited++;
    waitSum += waitMs[i]!;
  }
  const round = (x: number, digits = 0) => Math.round(x * 10 ** digits) / 10 ** digits;
  return {
    creates: n,
    startedLocal,
    startedCloud,
    refused,
    diverted: counts.diverted,
    divertedFellBackLocal: counts.divertedFellBackLocal,
    ineligible: byReason.stay_local! + byReason.layers_not_synced!,
    byReason,
    overflow: counts.overflow,
    overflowAbsorbedByCloud: startedCloud,
    overflowAbsorbedShare: round(counts.overflow === 0 ? 0 : startedCloud / counts.overflow, 4),
    noLocalRoomAtArrival: counts.noLocalRoomAtArrival,
    queueWaitP50Ms: round(percentile(50)),
    queueWaitP99Ms: round(percentile(99)),
    queueWaitMeanMs: round(n === 0 ? 0 : waitSum / n, 1),
    waited,
    cloudVmHours: round(cloudVmMs / 3_600_000, 3),
    peakCloudHosts,
    cloudProvisions: cloudHosts.length,
    divertingTimeShare: round(ticksDuringTrace === 0 ? 0 : divertingTicks / ticksDuringTrace, 4),
    meanUtilization: round(ticksDuringTrace === 0 ? 0 : utilizationSum / ticksDuringTrace, 4),
    peakUtilization: round(peakUtilization, 4),
    simulatedMs: nowMs,
    events: handled,
  };
}
