import type { MiddlewareHandler } from 'hono';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { ROLLOUT_TIME_PARTS, type NodeHeartbeat, type RolloutEnd, type RolloutTimesMs } from '../api/index.ts';
import type { NodeDirectory } from '../queues/index.ts';
import { REFUSAL_CAUSES } from './console/figures.ts';
import type { SignalRecorder } from './console/recorder.ts';

/** Seconds, from 5 ms to an hour: create waits and exec times (tool calls) share them. */
const WAIT_BUCKETS_SECONDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600];

/**
 * Gateway metrics in Prometheus format. One registry per gateway (not prom-client's
 * global one), so several gateways can live in one process in tests. They follow what
 * DSec says to watch: environment-creation waiting, tool execution time, refusals.
 */
export function createMetrics(directory: Pick<NodeDirectory, 'list'>, options: { signals?: SignalRecorder } = {}) {
  const registry = new Registry();
  const http = new Histogram({
    name: 'rollbox_http_request_duration_seconds',
    help: 'HTTP request latency by route and status',
    labelNames: ['method', 'route', 'status'] as const,
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    registers: [registry],
  });
  const creates = new Counter({ name: 'rollbox_sandbox_creates_total', help: 'sandbox create requests by outcome', labelNames: ['outcome'] as const, registers: [registry] });
  const refusals = new Counter({ name: 'rollbox_placement_refusals_total', help: 'create requests a node handed back', labelNames: ['node'] as const, registers: [registry] });
  const execs = new Counter({ name: 'rollbox_execs_total', help: 'exec requests by outcome', labelNames: ['outcome'] as const, registers: [registry] });
  new Gauge({
    name: 'rollbox_node_sandboxes',
    help: 'sandboxes per worker host, from its last heartbeat',
    labelNames: ['node', 'pool'] as const,
    registers: [registry],
    collect() {
      this.reset();
      for (const node of directory.list()) this.set({ node: node.nodeId, pool: node.pool }, node.sandboxes);
    },
  });
  new Gauge({
    name: 'rollbox_node_memory_reserved_ratio',
    help: 'requested memory of live sandboxes over capacity, per worker host',
    labelNames: ['node', 'pool'] as const,
    registers: [registry],
    collect() {
      this.reset();
      for (const node of directory.list()) this.set({ node: node.nodeId, pool: node.pool }, node.used.memoryMiB / Math.max(1, node.capacity.memoryMiB));
    },
  });

  // Per worker host, from its heartbeat: its sandboxes' memory in RAM and in swap, and what swap pauses gave back to admission.
  const memoryFigures = [
    ['rollbox_node_memory_resident_bytes', 'memory its sandboxes hold in the host\'s RAM (their cgroups)', (m: NonNullable<NodeHeartbeat['memory']>) => m.residentBytes],
    ['rollbox_node_memory_swapped_bytes', 'memory of its sandboxes in swap (paused with mode swap)', (m: NonNullable<NodeHeartbeat['memory']>) => m.swappedBytes],
    ['rollbox_node_memory_given_back_bytes', 'reservations swap pauses gave back to admission: what swapped sandboxes reserved less what they hold', (m: NonNullable<NodeHeartbeat['memory']>) => m.givenBackMiB * 1024 * 1024],
    ['rollbox_node_memory_vm_guest_unbacked_bytes', 'guest RAM of its microVMs that hand memory back which the host does not back (reported free, or never touched)', (m: NonNullable<NodeHeartbeat['memory']>) => m.guestUnbackedBytes ?? 0],
  ] as const;
  for (const [name, help, value] of memoryFigures) {
    new Gauge({
      name,
      help: `${help}, per worker host`,
      labelNames: ['node', 'pool'] as const,
      registers: [registry],
      collect() {
        this.reset();
        for (const node of directory.list()) if (node.memory) this.set({ node: node.nodeId, pool: node.pool }, value(node.memory));
      },
    });
  }

  const createWait = new Histogram({ name: 'rollbox_sandbox_create_wait_seconds', help: 'environment-creation wait: a create request\'s arrival to its sandbox running (admitted creates)', buckets: WAIT_BUCKETS_SECONDS, registers: [registry] });
  const execDuration = new Histogram({ name: 'rollbox_exec_duration_seconds', help: 'tool execution time: exec durations as the worker measured them', buckets: WAIT_BUCKETS_SECONDS, registers: [registry] });
  const createRefusals = new Counter({ name: 'rollbox_create_refusals_total', help: 'refused creates by cause (quota, no_capacity, network)', labelNames: ['cause'] as const, registers: [registry] });
  const batchTasks = new Counter({ name: 'rollbox_batch_tasks_ended_total', help: 'batch tasks that ended, by whether they succeeded', labelNames: ['succeeded'] as const, registers: [registry] });
  // Per training job (label `job`, with its tenant): a team runs few jobs at once, so these stay few series.
  const rolloutSeconds = new Counter({
    name: 'rollbox_rollout_seconds_total',
    help: 'where ended rollouts\' wall time went, by part (modelUpstream, modelHeld, tool, envWait, agent: they sum to the wall time), per job',
    labelNames: ['tenant', 'job', 'part'] as const,
    registers: [registry],
  });
  const rolloutsEnded = new Counter({ name: 'rollbox_rollouts_ended_total', help: 'hosted rollouts that ended, by how (succeeded, failed, timeout, limit, cancelled, infra_error), per job', labelNames: ['tenant', 'job', 'outcome'] as const, registers: [registry] });
  const { signals } = options;
  /** The console's figures and Prometheus' together, so the two never drift apart. */
  const seen = {
    createAdmitted(waitMs: number) {
      createWait.observe(waitMs / 1000);
      signals?.createAdmitted(waitMs);
    },
    createRefused(code: string) {
      const cause = REFUSAL_CAUSES[code];
      if (!cause) return;
      createRefusals.inc({ cause });
      signals?.createRefused(code);
    },
    execFinished(durationMs: number) {
      execDuration.observe(durationMs / 1000);
      signals?.observe('exec', durationMs);
    },
    taskEnded(succeeded: boolean) {
      batchTasks.inc({ succeeded: String(succeeded) });
      signals?.taskEnded(succeeded);
    },
    rolloutEnded(tenant: string, job: string, outcome: RolloutEnd, timesMs: RolloutTimesMs | undefined) {
      rolloutsEnded.inc({ tenant, job, outcome });
      if (timesMs) for (const part of ROLLOUT_TIME_PARTS) rolloutSeconds.inc({ tenant, job, part }, timesMs[part] / 1000);
    },
  };

  const middleware: MiddlewareHandler = async (c, next) => {
    const started = performance.now();
    await next();
    http.observe({ method: c.req.method, route: c.req.routePath, status: String(c.res.status) }, (performance.now() - started) / 1000);
  };
  return { registry, middleware, creates, refusals, execs, seen };
}

export type GatewayMetrics = ReturnType<typeof createMetrics>;
