import type { TraceEvent } from '../../api/index.ts';
// The pure placement and admission functions, imported from their files so the simulator
// does not load the Redis and runc parts of those modules.
import { chooseNode, idleHeartbeat, type PlacementCandidate } from '../../queues/placement.ts';
import { decideAdmission, type AdmissionState } from '../../workers/admission.ts';
import type { NodeUsage } from '../policy/index.ts';
import type { SimModel } from './model.ts';

const NO_EXCLUSIONS: ReadonlySet<string> = new Set();

/**
 * The local pool in the simulator: each node's true state (what its admission decides
 * on) and its last heartbeat plus the load placed since (what placement and the
 * controller see), as in the live system.
 */
export class LocalNodes {
  readonly admission: AdmissionState[] = [];
  /** Per node, as the controller's utilization reads it (refreshed by heartbeat). */
  readonly usages: NodeUsage[] = [];
  private readonly candidates: PlacementCandidate[] = [];
  private readonly nodeIndex = new Map<string, number>();

  constructor(private readonly model: SimModel) {
    for (let i = 0; i < model.localNodes; i++) {
      const capacity = { cpuMillis: model.nodeCpuMillis, memoryMiB: model.nodeMemoryMiB, maxSandboxes: model.nodeMaxSandboxes };
      // Traces carry no diskMiB: the model's disks never run out.
      this.admission.push({ capacity, reserved: { cpuMillis: 0, memoryMiB: 0, diskMiB: 0 }, sandboxes: 0, hostFreeMemoryMiB: Infinity, hostReserveMiB: 0, disk: { capacityMiB: Infinity, freeMiB: Infinity, sizeMiB: Infinity } });
      const nodeId = `local-${i}`;
      this.nodeIndex.set(nodeId, i);
      this.candidates.push({ ageMs: 0, assumed: { cpuMillis: 0, memoryMiB: 0, sandboxes: 0 }, heartbeat: idleHeartbeat(nodeId, 'local', { ...capacity, maxStarting: model.nodeMaxSandboxes }) });
      this.usages.push({ capacity: { cpuMillis: capacity.cpuMillis, memoryMiB: capacity.memoryMiB }, requested: { cpuMillis: 0, memoryMiB: 0 }, measured: { cpuFraction: 0, memoryFraction: 0 } });
    }
  }

  get count(): number {
    return this.admission.length;
  }

  anyAdmits(event: TraceEvent): boolean {
    return this.admission.some((state) => decideAdmission(state, event).admit);
  }

  admits(node: number, event: TraceEvent): boolean {
    return decideAdmission(this.admission[node]!, event).admit;
  }

  /**
   * d-choice placement on the last heartbeats, then the node's own admission; refusals
   * re-place, up to model.maxRefusals. The node that admitted it, with the load assumed
   * on its heartbeat, or undefined.
   */
  place(event: TraceEvent, random: () => number): number | undefined {
    let exclude = NO_EXCLUSIONS;
    for (let refusals = 0; ; ) {
      const chosen = chooseNode(this.candidates, { memoryMiB: event.memoryMiB, cpuMillis: event.cpuMillis, pool: 'local', exclude }, { choices: this.model.placementChoices, staleAfterMs: Infinity, random });
      if (chosen === undefined) return undefined;
      const node = this.nodeIndex.get(chosen.heartbeat.nodeId)!;
      if (this.admits(node, event)) {
        chosen.assumed.cpuMillis += event.cpuMillis;
        chosen.assumed.memoryMiB += event.memoryMiB;
        chosen.assumed.sandboxes++;
        return node;
      }
      if (++refusals > this.model.maxRefusals) return undefined;
      if (exclude === NO_EXCLUSIONS) exclude = new Set();
      (exclude as Set<string>).add(chosen.heartbeat.nodeId);
    }
  }

  reserve(node: number, event: TraceEvent): void {
    const state = this.admission[node]!;
    state.reserved.cpuMillis += event.cpuMillis;
    state.reserved.memoryMiB += event.memoryMiB;
    state.sandboxes++;
  }

  release(node: number, event: TraceEvent): void {
    const state = this.admission[node]!;
    state.reserved.cpuMillis -= event.cpuMillis;
    state.reserved.memoryMiB -= event.memoryMiB;
    state.sandboxes--;
  }

  hasRoomForMore(node: number): boolean {
    const state = this.admission[node]!;
    return state.sandboxes < state.capacity.maxSandboxes;
  }

  /** Every node reports its true state: placement and utilization see it, nothing is assumed any more. */
  heartbeat(nowMs: number): void {
    for (let i = 0; i < this.candidates.length; i++) {
      const { reserved, sandboxes, capacity } = this.admission[i]!;
      const candidate = this.candidates[i]!;
      const hb = candidate.heartbeat;
      hb.atMs = nowMs;
      hb.used.cpuMillis = reserved.cpuMillis;
      hb.used.memoryMiB = reserved.memoryMiB;
      hb.sandboxes = sandboxes;
      hb.measured.cpuLoad = (this.model.measuredShareOfRequest * reserved.cpuMillis) / capacity.cpuMillis;
      hb.measured.memoryUsedFraction = (this.model.measuredShareOfRequest * reserved.memoryMiB) / capacity.memoryMiB;
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
}
