/**
 * bench:density — what a host's own bookkeeping costs as it fills with idle sandboxes.
 * Sandboxes are created through the HTTP API (8 at once), each runs one command (so its
 * init has a keeper, as an agent's sandbox between turns does), then sit idle. At each
 * level of live sandboxes (BENCH_LEVELS, default 10,1000,3200; add 5000 if the host admits
 * them) the bench waits for the creates to settle, then measures:
 *   - the rollbox processes' CPU at idle (this process holds the gateway and the worker
 *     host: its own CPU over 10 s while it sends nothing) and redis-server's;
 *   - Redis calls per second over the same 10 s (INFO commandstats);
 *   - host memory per sandbox (MemTotal - MemAvailable, against the empty host);
 *   - exec of `true` into 20 random sandboxes, a first exec into each after the idle
 *     window and then again;
 *   - creates per second and deletes per second of 40 extra sandboxes at that density,
 *     beside the floor at that density: raw `runc run -d` + `runc delete -f` of the same
 *     config, 8 at once (what the kernel and runc alone do with that many sandboxes live).
 * Targets (issue 27): idle CPU at the top level at most 0.05 cores and at most 2x the
 * 10-live figure + 0.02; Redis calls/s within 20% of the 10-live figure; exec p50 at the
 * top level at most 1.2x the 10-live one; creates/s at the top level at least 0.8 of an
 * empty host's. Progress on stderr, a chart in bench/out/density.svg, one JSON line.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { Redis } from 'ioredis';
import { usedMiB } from './support/meminfo.ts';
import { redisCallsSoFar } from './support/redis-calls.ts';
import { jsonClient } from './support/http.ts';
import { rawRuncRunFloor, timed } from './support/runc-floor.ts';
import { lineChartsSvg, progressBar, summarize, writeSvg } from '../src/report/index.ts';
import { startTestCluster } from '../test/support/cluster.ts';

const LEVELS = (process.env.BENCH_LEVELS ?? '10,1000,3200').split(',').map(Number).sort((a, b) => a - b);
const TOP = LEVELS[LEVELS.length - 1]!;
const CONCURRENCY = 8;
const PROBES = 20;
const CHURN = 40;
const IDLE_WINDOW_MS = 10_000;
const SETTLE_MS = 5000;
/** Limits an agent may use; requests are what it reserves while it mostly sits idle. */
const RESOURCES = { memoryMiB: 256, cpuMillis: 100, diskMiB: 64, requests: { memoryMiB: 4, cpuMillis: 2 } };

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const round = (v: number, digits = 3) => Math.round(v * 10 ** digits) / 10 ** digits;

const NODE = 'bench-density';
const cluster = await startTestCluster({
  workers: [{ nodeId: NODE, env: { ROLLBOX_NODE_MAX_SANDBOXES: String(TOP + CHURN + 10) } }],
  env: { ROLLBOX_HEARTBEAT_MS: '1000', ROLLBOX_NODE_LOST_AFTER_MS: '10000', ROLLBOX_TENANT_MAX_SANDBOXES: String(TOP + CHURN + 10), ROLLBOX_LOG_LEVEL: 'warn' },
});
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));
const redis = new Redis(cluster.redisUrl);
const call = jsonClient(cluster.url, await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec'], 6 * 3600));
const ids: string[] = [];

/** `count` tasks, CONCURRENCY at a time, with a progress bar; the wall time. */
async function inParallel(label: string, count: number, task: (i: number) => Promise<void>): Promise<number> {
  const bar = progressBar(label, { total: count });
  let next = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < count) {
        await task(next++);
        bar.tick();
      }
    }),
  );
  bar.done();
  return performance.now() - started;
}
async function exec(id: string, cmd: string): Promise<void> {
  const e = await call('POST', `/v1/sandboxes/${id}/exec`, { cmd });
  if (e.status !== 200 || e.body.exitCode !== 0) throw new Error(`exec failed: ${e.status} ${JSON.stringify(e.body)}`);
}
async function create(into: string[]): Promise<void> {
  const r = await call('POST', '/v1/sandboxes', { resources: RESOURCES });
  if (r.status !== 201) throw new Error(`create ${ids.length + 1} failed: ${r.status} ${JSON.stringify(r.body)}`);
  into.push(r.body.id);
  await exec(r.body.id, 'echo ready > /root/state');
}
async function remove(id: string): Promise<void> {
  const r = await call('DELETE', `/v1/sandboxes/${id}`);
  if (r.status !== 200) throw new Error(`delete failed: ${r.status}`);
}
/** Seconds of CPU a process has used (utime + stime from /proc). */
function cpuSecondsOf(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

interface Level {
  live: number;
  rollboxCpuCores: number;
  redisCpuCores: number;
  redisCallsPerSecond: number;
  hostMiBPerSandbox: number;
  execFirstP50Ms: number;
  execFirstP99Ms: number;
  execAgainP50Ms: number;
  execAgainP99Ms: number;
  createsPerSecond: number;
  deletesPerSecond: number;
  /** Raw runc run + delete per second at this density (the floor). */
  floorRunsPerSecond: number;
}
const levels: Level[] = [];

try {
  await sleep(SETTLE_MS);
  const emptyMiB = usedMiB();
  for (const target of LEVELS) {
    await inParallel(`${target} idle sandboxes`, target - ids.length, () => create(ids));
    await sleep(SETTLE_MS);
    // Idle: nothing sent for IDLE_WINDOW_MS; only the cluster's own bookkeeping runs.
    const cpuBefore = process.cpuUsage();
    const redisCpuBefore = cpuSecondsOf(cluster.redisPid());
    const callsBefore = await redisCallsSoFar(redis);
    const windowStarted = performance.now();
    await sleep(IDLE_WINDOW_MS);
    const seconds = (performance.now() - windowStarted) / 1000;
    const calls = (await redisCallsSoFar(redis)) - callsBefore;
    const cpu = process.cpuUsage(cpuBefore);
    const redisCpu = cpuSecondsOf(cluster.redisPid()) - redisCpuBefore;
    const hostMiB = usedMiB() - emptyMiB;

    const probeIds = Array.from({ length: PROBES }, () => ids[Math.floor(Math.random() * ids.length)]!);
    const first: number[] = [];
    const again: number[] = [];
    for (const id of probeIds) first.push(await timed(() => exec(id, 'true')));
    for (const id of probeIds) again.push(await timed(() => exec(id, 'true')));
    const extra: string[] = [];
    const createMs = await inParallel(`${CHURN} creates at ${target} live`, CHURN, () => create(extra));
    const deleteMs = await inParallel(`${CHURN} deletes at ${target} live`, CHURN, (i) => remove(extra[i]!));
    const floorBar = progressBar(`floor at ${target} live`, { total: CHURN });
    const floor = await rawRuncRunFloor({ workerDir: path.join(cluster.rootDir, NODE, 'worker'), templateSandboxId: ids[0]!, runs: CHURN, concurrency: CONCURRENCY, deleteEach: true, onRun: () => floorBar.tick() });
    floorBar.done();
    const f = summarize(first);
    const a = summarize(again);
    const level: Level = {
      live: ids.length,
      rollboxCpuCores: round((cpu.user + cpu.system) / 1e6 / seconds),
      redisCpuCores: round(redisCpu / seconds),
      redisCallsPerSecond: round(calls / seconds, 1),
      hostMiBPerSandbox: round(hostMiB / ids.length, 2),
      execFirstP50Ms: round(f.p50Ms, 1),
      execFirstP99Ms: round(f.p99Ms, 1),
      execAgainP50Ms: round(a.p50Ms, 1),
      execAgainP99Ms: round(a.p99Ms, 1),
      createsPerSecond: round((CHURN / createMs) * 1000, 1),
      deletesPerSecond: round((CHURN / deleteMs) * 1000, 1),
      floorRunsPerSecond: round((CHURN / floor.wallMs) * 1000, 1),
    };
    levels.push(level);
    process.stderr.write(`${JSON.stringify(level)}\n`);
  }

  const series = (label: string, pick: (l: Level) => number) => ({ label, points: levels.map((l) => ({ x: l.live, y: pick(l) })) });
  const chart = writeSvg(
    path.resolve(import.meta.dirname, 'out', 'density.svg'),
    lineChartsSvg('idle sandboxes on one host: what the platform itself costs', 'live idle sandboxes', [
      { title: 'CPU at idle', yLabel: 'cores', series: [series('gateway + worker host', (l) => l.rollboxCpuCores), series('redis-server', (l) => l.redisCpuCores)] },
      { title: 'exec of `true` into random sandboxes', yLabel: 'ms', series: [series('p50, first', (l) => l.execFirstP50Ms), series('p50, again', (l) => l.execAgainP50Ms), series('p99, first', (l) => l.execFirstP99Ms)] },
      { title: 'Redis calls at idle', yLabel: 'calls per second', series: [series('all clients', (l) => l.redisCallsPerSecond)] },
      { title: 'churn at that density', yLabel: 'per second', series: [series('creates', (l) => l.createsPerSecond), series('deletes', (l) => l.deletesPerSecond), series('raw runc run + delete', (l) => l.floorRunsPerSecond)] },
    ]),
  );
  process.stderr.write(`chart: ${chart}\n`);
  const low = levels[0]!;
  const high = levels[levels.length - 1]!;
  console.log(
    JSON.stringify({
      bench: 'density',
      levels,
      ratios: {
        cpuTopOverLow: round(high.rollboxCpuCores / Math.max(low.rollboxCpuCores, 1e-3), 2),
        redisCallsTopOverLow: round(high.redisCallsPerSecond / low.redisCallsPerSecond, 2),
        execP50TopOverLow: round(high.execAgainP50Ms / low.execAgainP50Ms, 2),
        createsTopOverLow: round(high.createsPerSecond / low.createsPerSecond, 2),
        /** The same, each level's creates/s taken as a fraction of its own floor first. */
        createsOverFloorTopOverLow: round(high.createsPerSecond / high.floorRunsPerSecond / (low.createsPerSecond / low.floorRunsPerSecond), 2),
        floorTopOverLow: round(high.floorRunsPerSecond / low.floorRunsPerSecond, 2),
      },
      targets: { topCpuCores: 0.05, topCpuAtMost: round(2 * low.rollboxCpuCores + 0.02), redisCallsWithin: 0.2, execP50AtMost: 1.2, createsAtLeast: 0.8, hostMiBPerSandbox: 2 },
      resources: RESOURCES,
      chart,
    }),
  );
} finally {
  if (ids.length) await inParallel(`releasing ${ids.length} sandboxes`, ids.length, (i) => remove(ids[i]!).catch(() => undefined));
  redis.disconnect();
  await cluster.stop();
}
