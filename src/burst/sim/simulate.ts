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
 * This file holds one replay's state and its named steps; the local pool (local-nodes.ts),
 * the cloud pool (cloud-fleet.ts), events, wait queue and summary are files of their own.
 */
import type { BurstPolicy, TraceEvent } from '../../api/index.ts';
import { INITIAL_DIVERSION_STATE, decideCreate, mulberry32, rngStream, stepDiversion, utilizationOf } from '../policy/index.ts';
import { CloudFleet } from './cloud-fleet.ts';
import { EventHeap } from './heap.ts';
import { CLOUD_READY, CLOUD_WAIT_OVER, END_CLOUD, END_LOCAL, GIVE_UP, REFUSED, STARTED_CLOUD, STARTED_LOCAL, TICK, WAITING, WAITING_FOR_CLOUD, type SimEvent } from './events.ts';
import { LocalNodes } from './local-nodes.ts';
import { summarize } from './summary.ts';
import { WaitQueue } from './wait-queue.ts';
import type { SimModel, SimResult } from './model.ts';

/** Waiting entries a freed node looks at: enough to skip a head too big for it, bounded per release. */
const PULL_SCAN_LIMIT = 32;

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

  private readonly local: LocalNodes;
  private readonly pulledSinceTick: Uint8Array;
  private readonly cloud: CloudFleet;

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
    this.local = new LocalNodes(model);
    this.cloud = new CloudFleet(policy);
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
    if (!this.local.anyAdmits(event)) this.counts.noLocalRoomAtArrival++;
    const decision = decideCreate(this.diversion, event, this.syncedLayers, shareDraw, this.policy);
    this.byReason[decision.reason]!++;
    if (decision.target !== 'cloud') return this.placeOrQueueLocal(id, placementRandom, false);
    this.counts.diverted++;
    const host = this.cloud.hostWithSlot();
    if (host >= 0) return this.startCloud(id, host);
    this.divertedOutsideCloud[id] = 1;
    this.pendingDivertedDemand++;
    if (this.model.cloudWaitMs > 0 && this.cloud.canGrow()) {
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

  private placeLocal(id: number, random: () => number): boolean {
    const node = this.local.place(this.events[id]!, random);
    if (node === undefined) return false;
    this.startLocal(id, node);
    return true;
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
    this.local.reserve(node, event);
    this.markStarted(id, STARTED_LOCAL);
    this.schedule(this.nowMs + event.lifetimeMs, END_LOCAL, id, node);
  }

  private startCloud(id: number, hostIndex: number): void {
    const event = this.events[id]!;
    this.cloud.start(hostIndex, event);
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
    this.pulledSinceTick[node] = 1;
    this.localQueue.scan(PULL_SCAN_LIMIT, (id) => {
      if (this.local.admits(node, this.events[id]!)) this.startLocal(id, node);
      return this.local.hasRoomForMore(node);
    });
  }

  private pullCloud(hostIndex: number): void {
    if (this.cloud.hosts[hostIndex]!.state !== 'ready') return;
    this.cloudQueue.scan(this.policy.cloudHostSandboxes, (id) => {
      this.startCloud(id, hostIndex);
      return this.cloud.hasSlot(hostIndex);
    });
  }

  // --- ticks --------------------------------------------------------------------------

  private tick(): void {
    const { policy, model } = this;
    this.local.heartbeat(this.nowMs);
    const utilization = utilizationOf(this.local.usages, policy.utilizationBasis);
    const share = policy.utilizationBasis === 'measured' ? model.measuredShareOfRequest : 1;
    const utilizationWithCloudLoad = utilizationOf(this.local.usages, policy.utilizationBasis, { cpuMillis: share * this.cloud.load.cpuMillis, memoryMiB: share * this.cloud.load.memoryMiB });
    this.diversion = stepDiversion(this.diversion, utilization, this.nowMs, policy, utilizationWithCloudLoad);
    if (this.nextArrival < this.n) {
      this.ticksDuringTrace++;
      this.utilizationSum += utilization;
      this.peakUtilization = Math.max(this.peakUtilization, utilization);
      if (this.diversion.diverting) this.divertingTicks++;
    }
    for (const host of this.cloud.scale(this.pendingDivertedDemand, this.nowMs)) {
      this.schedule(this.nowMs + model.cloudProvisioningDelayMs + model.cloudLayerSyncDelayMs, CLOUD_READY, host, host);
    }
    // Nodes pull when a sandbox ends; one that had no end since the last tick (idle, or
    // room that appeared before a create queued) pulls here so nothing waits on it forever.
    for (let node = 0; node < this.local.count && this.waiting > 0; node++) if (!this.pulledSinceTick[node]) this.pullLocal(node);
    this.pulledSinceTick.fill(0);
    if (this.nextArrival < this.n || this.waiting > 0 || this.running > 0 || this.cloud.isProvisioning()) this.schedule(this.nowMs + model.heartbeatIntervalMs, TICK, 0, 0);
  }

  // --- events -------------------------------------------------------------------------

  private handle(event: SimEvent): void {
    switch (event.kind) {
      case END_LOCAL: {
        this.local.release(event.where, this.events[event.id]!);
        this.running--;
        this.leaveDivertedDemand(event.id);
        this.pullLocal(event.where);
        break;
      }
      case END_CLOUD: {
        this.cloud.end(event.where, this.events[event.id]!, this.nowMs);
        this.running--;
        this.pullCloud(event.where);
        break;
      }
      case CLOUD_READY: {
        if (this.cloud.markReady(event.where, this.nowMs)) this.pullCloud(event.where);
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
    return summarize({
      outcome: this.outcome,
      waitMs: this.waitMs,
      counts: this.counts,
      byReason: this.byReason,
      cloudVmMs: this.cloud.billedVmMs(this.nowMs),
      peakCloudHosts: this.cloud.peakHosts,
      cloudProvisions: this.cloud.hosts.length,
      ticksDuringTrace: this.ticksDuringTrace,
      divertingTicks: this.divertingTicks,
      utilizationSum: this.utilizationSum,
      peakUtilization: this.peakUtilization,
      simulatedMs: this.nowMs,
      events: this.handled,
    });
  }
}
