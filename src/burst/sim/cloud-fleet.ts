import type { BurstPolicy, TraceEvent } from '../../api/index.ts';
import { planCloudScaling } from '../policy/index.ts';
import type { CloudHost } from './events.ts';

/**
 * The cloud pool in the simulator: hosts from provision to termination, their slots,
 * the load they carry, the provisions of the last minute (the policy's rate limit) and
 * the VM time they are billed.
 */
export class CloudFleet {
  /** Every host ever provisioned, by index (events name a host by its index). */
  readonly hosts: CloudHost[] = [];
  private live: CloudHost[] = [];
  /** Requested resources of the sandboxes running in the cloud. */
  readonly load = { cpuMillis: 0, memoryMiB: 0 };
  private readonly provisionTimesMs: number[] = [];
  private provisionWindowStart = 0;
  private vmMs = 0;
  peakHosts = 0;

  constructor(private readonly policy: BurstPolicy) {}

  /** As the live controller judges it: a host is on its way, or one may still be started. */
  canGrow(): boolean {
    return this.isProvisioning() || this.live.length < this.policy.maxCloudHosts;
  }

  isProvisioning(): boolean {
    return this.live.some((h) => h.state === 'provisioning');
  }

  /** The ready host with a free slot that is fullest (packing lets the others idle out); -1 if none. */
  hostWithSlot(): number {
    let best: CloudHost | undefined;
    for (const host of this.live) {
      if (host.state !== 'ready' || host.sandboxes >= this.policy.cloudHostSandboxes) continue;
      if (best === undefined || host.sandboxes > best.sandboxes) best = host;
    }
    return best?.index ?? -1;
  }

  hasSlot(index: number): boolean {
    return this.hosts[index]!.sandboxes < this.policy.cloudHostSandboxes;
  }

  start(index: number, event: TraceEvent): void {
    const host = this.hosts[index]!;
    host.sandboxes++;
    host.idleSinceMs = null;
    this.load.cpuMillis += event.cpuMillis;
    this.load.memoryMiB += event.memoryMiB;
  }

  end(index: number, event: TraceEvent, nowMs: number): void {
    const host = this.hosts[index]!;
    host.sandboxes--;
    this.load.cpuMillis -= event.cpuMillis;
    this.load.memoryMiB -= event.memoryMiB;
    if (host.sandboxes === 0) host.idleSinceMs = nowMs;
  }

  /** A provisioned host is ready; false if it was terminated meanwhile. */
  markReady(index: number, nowMs: number): boolean {
    const host = this.hosts[index]!;
    if (host.state !== 'provisioning') return false;
    host.state = 'ready';
    host.idleSinceMs = nowMs;
    return true;
  }

  /** The policy's scaling step: terminates hosts and returns the indexes of those it provisions. */
  scale(pendingDivertedDemand: number, nowMs: number): number[] {
    const { provisionTimesMs } = this;
    while (this.provisionWindowStart < provisionTimesMs.length && provisionTimesMs[this.provisionWindowStart]! <= nowMs - 60_000) this.provisionWindowStart++;
    const plan = planCloudScaling(
      {
        cloudHosts: this.live.map((h) => ({ id: h.id, state: h.state === 'ready' ? 'ready' : 'provisioning', sandboxes: h.sandboxes, idleSinceMs: h.idleSinceMs })),
        pendingDivertedDemand,
        provisionsInLastMinute: provisionTimesMs.length - this.provisionWindowStart,
        nowMs,
      },
      this.policy,
    );
    if (plan.terminate.length > 0) {
      const ending = new Set(plan.terminate);
      for (const host of this.live) {
        if (!ending.has(host.id)) continue;
        host.state = 'terminated';
        this.vmMs += nowMs - host.provisionedAtMs;
      }
      this.live = this.live.filter((h) => h.state !== 'terminated');
    }
    const provisioned: number[] = [];
    for (let k = 0; k < plan.provision; k++) {
      const host: CloudHost = { id: `cloud-${this.hosts.length}`, index: this.hosts.length, state: 'provisioning', sandboxes: 0, idleSinceMs: null, provisionedAtMs: nowMs };
      this.hosts.push(host);
      this.live.push(host);
      provisionTimesMs.push(nowMs);
      provisioned.push(host.index);
    }
    this.peakHosts = Math.max(this.peakHosts, this.live.length);
    return provisioned;
  }

  /** VM time billed; hosts still up at the end would idle out after idleTerminateMs, so they are billed until then. */
  billedVmMs(endMs: number): number {
    let vmMs = this.vmMs;
    for (const host of this.live) vmMs += Math.max(endMs, (host.idleSinceMs ?? endMs) + this.policy.idleTerminateMs) - host.provisionedAtMs;
    return vmMs;
  }
}
