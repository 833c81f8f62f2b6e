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
 *
 * Longer than most: one replay's state and the named steps that change it (a class whose
 * methods share that state); its events, wait queue and summary are files of their own.
 */
import type { BurstPolicy, TraceEvent } from '../../api/index.ts';
// The pure placement and admission functions, imported from their files so the simulator
// does not load the Redis and runc parts of those modules.
import { chooseNode, idleHeartbeat, type PlacementCandidate } from '../../queues/placement.ts';
import { decideAdmission, type AdmissionState } from '../../workers/admission.ts';
import { INITIAL_DIVERSION_STATE, decideCreate, mulberry32, planCloudScaling, rngStream, stepDiversion, utilizationOf, type NodeUsage } from '../policy/index.ts';
import { EventHeap } from './heap.ts';
import { CLOUD_READY, CLOUD_WAIT_OVER, END_CLOUD, END_LOCAL, GIVE_UP, REFUSED, STARTED_CLOUD, STARTED_LOCAL, TICK, WAITING, WAITING_FOR_CLOUD, type CloudHost, type SimEvent } from './events.ts';
import { summarize } from './summary.ts';
import { WaitQueue } from './wait-queue.ts';
import type { SimModel, SimResult } from './model.ts';

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
  return new Simulation(events, policy, model, syncedLayers).run(options);
}

/**
 * One replay. Its steps, by name: `arrive` (route a create: cloud, local, or queue),
 * `tick` (heartbeats, diversion, cloud scaling, idle nodes pulling), `handle` (a sandbox
 * ends, a cloud host is ready, a wait is over or given up), and `summary`.
 */
class Simulation {
  private readonly n: number;
  private readonly heap = new EventHeap<SimEvent>();
  private seq = 0;
  private nowMs = 0;
  private readonly shareRandom: () => number;
  private readonly placementSeed: number;

  // Local nodes: true state (admission) and the last heartbeat (placement, controller).
  private readonly admission: AdmissionState[] = [];
  private readonly candidates: PlacementCandidate[] = [];
  private readonly usages: NodeUsage[] = [];
  private readonly nodeIndex = new Map<string, number>();
  private readonly pulledSinceTick: Uint8Array;

  private readonly cloudHosts: CloudHost[] = [];
  private liveCloudHosts: CloudHost[] = [];
  /** Requested resources of the sandboxes running in the cloud. */
  private readonly cloudLoad = { cpuMillis: 0, memoryMiB: 0 };
  private readonly provisionTimesMs: number[] = [];
  private provisionWindowStart = 0;
  private cloudVmMs = 0;
  private peakCloudHosts = 0;

  private readonly outcome: Uint8Array;
  private readonly waitMs: Float64Array;
  /** Diverted but not (yet) in the cloud: counted in the pending diverted demand. */
  private readonly divertedOutsideCloud: Uint8Array;
  private pendingDivertedDemand = 0;
  private waiting = 0;
  private running = 0;
  private readonly counts = { diverted: 0, divertedFellBackLocal: 0, overflow: 0, noLocalRoomAtArrival: 0 };
  private readonly byReason: Record<string, number> = { not_diverting: 0, stay_local: 0, layers_not_synced: 0, share: 0, diverted: 0 };

  private diversion = INITIAL_DIVERSION_STATE;
  private ticksDuringTrace = 0;
  private divertingTicks = 0;
  private utilizationSum = 0;
  private peakUtilization = 0;
  private nextArrival = 0;
  private handled = 0;

  private readonly localQueue: WaitQueue;
  private readonly cloudQueue: WaitQueue;

  constructor(
    private readonly events: readonly TraceEvent[],
    private readonly policy: BurstPolicy,
    private readonly model: SimModel,
    private readonly syncedLayers: ReadonlySet<string>,
  ) {
    this.n = events.length;
    this.shareRandom = rngStream(model.seed, 'divert-share');
    this.placementSeed = rngStream(model.seed, 'placement')() * 4_294_967_296;
    for (let i = 0; i < model.localNodes; i++) {
      const capacity = { cpuMillis: model.nodeCpuMillis, memoryMiB: model.nodeMemoryMiB, maxSandboxes: model.nodeMaxSandboxes };
      // Traces carry no diskMiB: the model's disks never run out.
      this.admission.push({ capacity, reserved: { cpuMillis: 0, memoryMiB: 0, diskMiB: 0 }, sandboxes: 0, hostFreeMemoryMiB: Infinity, hostReserveMiB: 0, disk: { capacityMiB: Infinity, freeMiB: Infinity, sizeMiB: Infinity } });
      const nodeId = `local-${i}`;
      this.nodeIndex.set(nodeId, i);
      this.candidates.push({ ageMs: 0, assumed: { cpuMillis: 0, memoryMiB: 0, sandboxes: 0 }, heartbeat: idleHeartbeat(nodeId, 'local', { ...capacity, maxStarting: model.nodeMaxSandboxes }) });
      this.usages.push({ capacity: { cpuMillis: capacity.cpuMillis, memoryMiB: capacity.memoryMiB }, requested: { cpuMillis: 0, memoryMiB: 0 }, measured: { cpuFraction: 0, memoryFraction: 0 } });
    }
    this.pulledSinceTick = new Uint8Array(model.localNodes);
    this.outcome = new Uint8Array(this.n);
    this.waitMs = new Float64Array(this.n);
    this.divertedOutsideCloud = new Uint8Array(this.n);
    this.localQueue = new WaitQueue((id) => this.outcome[id] === WAITING);
    this.cloudQueue = new WaitQueue((id) => this.outcome[id] === WAITING || this.outcome[id] === WAITING_FOR_CLOUD);
  }

  run(options: SimulateOptions): SimResult {
    const { events, n, heap } = this;
    const progressEvery = Math.max(1, Math.floor(n / 200));
    this.schedule(events[0]?.atMs ?? 0, TICK, 0, 0);
    for (;;) {
      const top = heap.peek();
      const arrivalAtMs = this.nextArrival < n ? events[this.nextArrival]!.atMs : Infinity;
      if (top === undefined && arrivalAtMs === Infinity) break;
      this.handled++;
      // At equal times, releases and heartbeats come before the arrival.
      if (top !== undefined && top.atMs <= arrivalAtMs) {
        heap.pop();
        this.nowMs = top.atMs;
        this.handle(top);
      } else {
        this.nowMs = arrivalAtMs;
        this.arrive(this.nextArrival++);
        if (this.nextArrival % progressEvery === 0) options.onProgress?.(this.nextArrival / n);
      }
    }
    options.onProgress?.(1);
    options.waitsMs?.set(this.waitMs.subarray(0, Math.min(n, options.waitsMs.length)));
    return this.summary();
  }

  private schedule(atMs: number, kind: number, id: number, where: number): void {
    this.heap.push({ atMs, seq: this.seq++, kind, id, where });
  }

  // --- arrivals ---------------------------------------------------------------------

  private arrive(id: number): void {
    this.route(id);
    if (this.outcome[id] !== STARTED_LOCAL) this.counts.overflow++;
  }

  private route(id: number): void {
    const event = this.events[id]!;
    // Drawn for every create, diverting or not, so the streams stay aligned across policies.
    const shareDraw = this.shareRandom();
    const placementRandom = this.placementRandomOf(id);
    if (!this.admission.some((state) => decideAdmission(state, event).admit)) this.counts.noLocalRoomAtArrival++;
    const decision = decideCreate(this.diversion, event, this.syncedLayers, shareDraw, this.policy);
    this.byReason[decision.reason]!++;
    if (decision.target !== 'cloud') return this.placeOrQueueLocal(id, placementRandom, false);
    this.counts.diverted++;
    const host = this.cloudHostWithSlot();
    if (host >= 0) return this.startCloud(id, host);
    this.divertedOutsideCloud[id] = 1;
    this.pendingDivertedDemand++;
    if (this.model.cloudWaitMs > 0 && this.cloudPoolCanGrow()) {
      this.outcome[id] = WAITING_FOR_CLOUD;
      this.waiting++;
      this.cloudQueue.push(id);
      this.schedule(this.nowMs + this.model.maxQueueWaitMs, GIVE_UP, id, 0);
      this.schedule(this.nowMs + this.model.cloudWaitMs, CLOUD_WAIT_OVER, id, 0);
      return;
    }
    this.counts.divertedFellBackLocal++;
    this.placeOrQueueLocal(id, placementRandom, true);
  }

  /** Each create's own placement stream: what other creates did never shifts its draws. */
  private placementRandomOf(id: number): () => number {
    return mulberry32((this.placementSeed + Math.imul(id, 0x9e3779b1)) >>> 0);
  }

  /** As the live controller judges it: a host is on its way, or one may still be started. */
  private cloudPoolCanGrow(): boolean {
    return this.liveCloudHosts.some((h) => h.state === 'provisioning') || this.liveCloudHosts.length < this.policy.maxCloudHosts;
  }

  /** The ready host with a free slot that is fullest: packing lets the others idle out. */
  private cloudHostWithSlot(): number {
    let best: CloudHost | undefined;
    for (const host of this.liveCloudHosts) {
      if (host.state !== 'ready' || host.sandboxes >= this.policy.cloudHostSandboxes) continue;
      if (best === undefined || host.sandboxes > best.sandboxes) best = host;
    }
    return best?.index ?? -1;
  }

  private placeOrQueueLocal(id: number, random: () => number, cloudMayTakeIt: boolean): void {
    if (this.placeLocal(id, random)) return;
    if (this.outcome[id] !== WAITING_FOR_CLOUD) {
      this.waiting++;
      this.schedule(this.events[id]!.atMs + this.model.maxQueueWaitMs, GIVE_UP, id, 0);
    }
    this.outcome[id] = WAITING;
    this.localQueue.push(id);
    if (cloudMayTakeIt) this.cloudQueue.push(id);
  }

  /** d-choice placement on the last heartbeats, then the node's own admission; refusals re-place. */
  private placeLocal(id: number, random: () => number): boolean {
    const event = this.events[id]!;
    let exclude = NO_EXCLUSIONS;
    for (let refusals = 0; ; ) {
      const chosen = chooseNode(this.candidates, { memoryMiB: event.memoryMiB, cpuMillis: event.cpuMillis, pool: 'local', exclude }, { choices: this.model.placementChoices, staleAfterMs: Infinity, random });
      if (chosen === undefined) return false;
      const node = this.nodeIndex.get(chosen.heartbeat.nodeId)!;
      if (decideAdmission(this.admission[node]!, event).admit) {
        chosen.assumed.cpuMillis += event.cpuMillis;
        chosen.assumed.memoryMiB += event.memoryMiB;
        chosen.assumed.sandboxes++;
        this.startLocal(id, node);
        return true;
      }
      if (++refusals > this.model.maxRefusals) return false;
      if (exclude === NO_EXCLUSIONS) exclude = new Set();
      (exclude as Set<string>).add(chosen.heartbeat.nodeId);
    }
  }

  // --- starts and pulls ---------------------------------------------------------------

  private markStarted(id: number, how: number): void {
    if (this.outcome[id] === WAITING || this.outcome[id] === WAITING_FOR_CLOUD) this.waiting--;
    this.outcome[id] = how;
    this.waitMs[id] = this.nowMs - this.events[id]!.atMs;
    this.running++;
  }

  private startLocal(id: number, node: number): void {
    const event = this.events[id]!;
    const state = this.admission[node]!;
    state.reserved.cpuMillis += event.cpuMillis;
    state.reserved.memoryMiB += event.memoryMiB;
    state.sandboxes++;
    this.markStarted(id, STARTED_LOCAL);
    this.schedule(this.nowMs + event.lifetimeMs, END_LOCAL, id, node);
  }

  private startCloud(id: number, hostIndex: number): void {
    const host = this.cloudHosts[hostIndex]!;
    const event = this.events[id]!;
    host.sandboxes++;
    host.idleSinceMs = null;
    this.cloudLoad.cpuMillis += event.cpuMillis;
    this.cloudLoad.memoryMiB += event.memoryMiB;
    this.markStarted(id, STARTED_CLOUD);
    this.leaveDivertedDemand(id);
    this.schedule(this.nowMs + event.lifetimeMs, END_CLOUD, id, hostIndex);
  }

  private leaveDivertedDemand(id: number): void {
    if (!this.divertedOutsideCloud[id]) return;
    this.divertedOutsideCloud[id] = 0;
    this.pendingDivertedDemand--;
  }

  private pullLocal(node: number): void {
    const state = this.admission[node]!;
    this.pulledSinceTick[node] = 1;
    this.localQueue.scan(PULL_SCAN_LIMIT, (id) => {
      if (decideAdmission(state, this.events[id]!).admit) this.startLocal(id, node);
      return state.sandboxes < state.capacity.maxSandboxes;
    });
  }

  private pullCloud(hostIndex: number): void {
    const host = this.cloudHosts[hostIndex]!;
    if (host.state !== 'ready') return;
    this.cloudQueue.scan(this.policy.cloudHostSandboxes, (id) => {
      this.startCloud(id, hostIndex);
      return host.sandboxes < this.policy.cloudHostSandboxes;
    });
  }

  // --- ticks --------------------------------------------------------------------------

  private tick(): void {
    const { policy, model } = this;
    this.heartbeat();
    const utilization = utilizationOf(this.usages, policy.utilizationBasis);
    const share = policy.utilizationBasis === 'measured' ? model.measuredShareOfRequest : 1;
    const utilizationWithCloudLoad = utilizationOf(this.usages, policy.utilizationBasis, { cpuMillis: share * this.cloudLoad.cpuMillis, memoryMiB: share * this.cloudLoad.memoryMiB });
    this.diversion = stepDiversion(this.diversion, utilization, this.nowMs, policy, utilizationWithCloudLoad);
    if (this.nextArrival < this.n) {
      this.ticksDuringTrace++;
      this.utilizationSum += utilization;
      this.peakUtilization = Math.max(this.peakUtilization, utilization);
      if (this.diversion.diverting) this.divertingTicks++;
    }
    this.scaleCloud();
    // Nodes pull when a sandbox ends; one that had no end since the last tick (idle, or
    // room that appeared before a create queued) pulls here so nothing waits on it forever.
    for (let node = 0; node < this.admission.length && this.waiting > 0; node++) if (!this.pulledSinceTick[node]) this.pullLocal(node);
    this.pulledSinceTick.fill(0);
    const provisioning = this.liveCloudHosts.some((h) => h.state === 'provisioning');
    if (this.nextArrival < this.n || this.waiting > 0 || this.running > 0 || provisioning) this.schedule(this.nowMs + model.heartbeatIntervalMs, TICK, 0, 0);
  }

  private heartbeat(): void {
    for (let i = 0; i < this.candidates.length; i++) {
      const { reserved, sandboxes, capacity } = this.admission[i]!;
      const candidate = this.candidates[i]!;
      const hb = candidate.heartbeat;
      hb.atMs = this.nowMs;
      hb.used.cpuMillis = reserved.cpuMillis;
      hb.used.memoryMiB = reserved.memoryMiB;
      hb.sandboxes = sandboxes;
      hb.measured.cpuLoad = (this.model.measuredShareOfRequest * reserved.cpuMillis) / capacity.cpuMillis;
      hb.measured.memoryUsedFraction = (this.model.measuredShareOfRequest * reserved.memoryMiB) / capacity.memoryMiB;
      // The heartbeat shows everything placed so far: nothing is assumed any more.
      candidate.assumed.cpuMillis = 0;
      candidate.assumed.memoryMiB = 0;
      candidate.assumed.sandboxes = 0;
      const usage = this.usages[i]!;
      usage.requested.cpuMillis = reserved.cpuMillis;
      usage.requested.memoryMiB = reserved.memoryMiB;
      usage.measured.cpuFraction = hb.measured.cpuLoad;
      usage.measured.memoryFraction = hb.measured.memoryUsedFraction;
    }
  }

  private scaleCloud(): void {
    const { nowMs, provisionTimesMs } = this;
    while (this.provisionWindowStart < provisionTimesMs.length && provisionTimesMs[this.provisionWindowStart]! <= nowMs - 60_000) this.provisionWindowStart++;
    const plan = planCloudScaling(
      {
        cloudHosts: this.liveCloudHosts.map((h) => ({ id: h.id, state: h.state === 'ready' ? 'ready' : 'provisioning', sandboxes: h.sandboxes, idleSinceMs: h.idleSinceMs })),
        pendingDivertedDemand: this.pendingDivertedDemand,
        provisionsInLastMinute: provisionTimesMs.length - this.provisionWindowStart,
        nowMs,
      },
      this.policy,
    );
    if (plan.terminate.length > 0) {
      const ending = new Set(plan.terminate);
      for (const host of this.liveCloudHosts) {
        if (!ending.has(host.id)) continue;
        host.state = 'terminated';
        this.cloudVmMs += nowMs - host.provisionedAtMs;
      }
      this.liveCloudHosts = this.liveCloudHosts.filter((h) => h.state !== 'terminated');
    }
    for (let k = 0; k < plan.provision; k++) {
      const host: CloudHost = { id: `cloud-${this.cloudHosts.length}`, index: this.cloudHosts.length, state: 'provisioning', sandboxes: 0, idleSinceMs: null, provisionedAtMs: nowMs };
      this.cloudHosts.push(host);
      this.liveCloudHosts.push(host);
      provisionTimesMs.push(nowMs);
      this.schedule(nowMs + this.model.cloudProvisioningDelayMs + this.model.cloudLayerSyncDelayMs, CLOUD_READY, host.index, host.index);
    }
    this.peakCloudHosts = Math.max(this.peakCloudHosts, this.liveCloudHosts.length);
  }

  // --- events -------------------------------------------------------------------------

  private handle(event: SimEvent): void {
    switch (event.kind) {
      case END_LOCAL: {
        const state = this.admission[event.where]!;
        const create = this.events[event.id]!;
        state.reserved.cpuMillis -= create.cpuMillis;
        state.reserved.memoryMiB -= create.memoryMiB;
        state.sandboxes--;
        this.running--;
        this.leaveDivertedDemand(event.id);
        this.pullLocal(event.where);
        break;
      }
      case END_CLOUD: {
        const host = this.cloudHosts[event.where]!;
        host.sandboxes--;
        this.cloudLoad.cpuMillis -= this.events[event.id]!.cpuMillis;
        this.cloudLoad.memoryMiB -= this.events[event.id]!.memoryMiB;
        this.running--;
        if (host.sandboxes === 0) host.idleSinceMs = this.nowMs;
        this.pullCloud(event.where);
        break;
      }
      case CLOUD_READY: {
        const host = this.cloudHosts[event.where]!;
        if (host.state !== 'provisioning') break;
        host.state = 'ready';
        host.idleSinceMs = this.nowMs;
        this.pullCloud(event.where);
        break;
      }
      case CLOUD_WAIT_OVER:
        if (this.outcome[event.id] !== WAITING_FOR_CLOUD) break;
        this.counts.divertedFellBackLocal++;
        this.placeOrQueueLocal(event.id, this.placementRandomOf(event.id), true);
        break;
      case GIVE_UP:
        if (this.outcome[event.id] !== WAITING && this.outcome[event.id] !== WAITING_FOR_CLOUD) break;
        this.outcome[event.id] = REFUSED;
        this.waitMs[event.id] = this.model.maxQueueWaitMs;
        this.waiting--;
        this.leaveDivertedDemand(event.id);
        break;
      case TICK:
        this.tick();
        break;
    }
  }

  // --- the result ---------------------------------------------------------------------

  private summary(): SimResult {
    // Hosts still up at the end would idle out after idleTerminateMs: bill them until then.
    for (const host of this.liveCloudHosts) this.cloudVmMs += Math.max(this.nowMs, (host.idleSinceMs ?? this.nowMs) + this.policy.idleTerminateMs) - host.provisionedAtMs;
    return summarize({
      outcome: this.outcome,
      waitMs: this.waitMs,
      counts: this.counts,
      byReason: this.byReason,
      cloudVmMs: this.cloudVmMs,
      peakCloudHosts: this.peakCloudHosts,
      cloudProvisions: this.cloudHosts.length,
      ticksDuringTrace: this.ticksDuringTrace,
      divertingTicks: this.divertingTicks,
      utilizationSum: this.utilizationSum,
      peakUtilization: this.peakUtilization,
      simulatedMs: this.nowMs,
      events: this.handled,
    });
  }
}
