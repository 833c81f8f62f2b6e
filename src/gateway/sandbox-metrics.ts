import { RollboxError, newId, type SandboxMetrics } from '../api/index.ts';
import { requireScope, type Principal } from '../iam/index.ts';
import type { SandboxRegistry } from '../registry/index.ts';
import { toRollboxError, type NodeRequests } from './node-requests.ts';

/** Reading a few cgroup files and a statfs (and, at most, a 200 ms CPU window). */
const METRICS_REPLY_TIMEOUT_MS = 10_000;
const MIB = 1024 * 1024;

/**
 * One sample of a sandbox's resource use, read by its worker host from the sandbox's
 * cgroups (CPU time, memory and page cache) and its own disk, in the shape E2B's
 * `getMetrics` returns: CPU as a share of its cores, memory and disk in bytes.
 */
export class SandboxMetricsService {
  constructor(private readonly deps: { registry: Pick<SandboxRegistry, 'getOwned'>; nodes: Pick<NodeRequests, 'sendOp'> }) {}

  async sample(principal: Principal, id: string): Promise<SandboxMetrics> {
    requireScope(principal, 'sandbox:read');
    const sandbox = await this.deps.registry.getOwned(id, principal.tenant);
    if (sandbox.state !== 'running') throw new RollboxError('invalid_state', `sandbox ${id} is ${sandbox.state}; metrics are read from a running sandbox`);
    const reply = await this.deps.nodes.sendOp(sandbox.node!, { kind: 'metrics', sandboxId: id, requestId: newId('req') }, METRICS_REPLY_TIMEOUT_MS);
    if (reply.kind === 'error') throw toRollboxError(reply.error);
    if (reply.kind !== 'metrics') throw new RollboxError('internal', `unexpected reply ${reply.kind}`);
    const m = reply.metrics;
    const cores = sandbox.spec.resources.cpuMillis / 1000;
    return {
      timestamp: new Date(m.atMs).toISOString(),
      cpuUsedPct: Math.round((m.cpuUsedMs / Math.max(1, m.windowMs) / cores) * 10_000) / 100,
      cpuCount: Math.max(1, Math.ceil(cores)),
      memUsed: m.memoryUsedBytes,
      memTotal: sandbox.spec.resources.memoryMiB * MIB,
      memCache: m.memoryCacheBytes,
      diskUsed: m.diskUsedBytes,
      diskTotal: m.diskTotalBytes,
    };
  }
}
