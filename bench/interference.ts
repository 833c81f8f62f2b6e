/**
 * bench:interference — exec round trip of one `latency` sandbox alone, then with neighbours
 * burning every core as `besteffort` (protected: SCHED_IDLE, idle CPU weight, and the
 * worker's besteffort guard holding them at 1% of a CPU while a latency command runs), then
 * with the same neighbours as `latency` (unprotected: normal scheduling, normal weight). Two
 * commands: a small shell loop (CPU-bound, so contention shows) and `true`. Phases are
 * interleaved over several rounds so that drift in the host's other load hits all three alike.
 * The neighbours' CPU use per phase (cores) shows what the protection costs them. A fourth
 * phase has no neighbours but a warm pool refilling on the host throughout (paced, runc under
 * SCHED_IDLE): its cost to the latency sandbox.
 * ROLLBOX_BESTEFFORT_* variables go to the worker (ROLLBOX_BESTEFFORT_HOLD_MS=0: the scheduler only).
 * Progress on stderr, CDF charts in bench/out/, one JSON line at the end.
 */
import { readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadConfig } from '../src/config/index.ts';
import { api, startTestCluster } from '../test/support/cluster.ts';
import { timed } from './support/runc-floor.ts';
import { progressBar, summarize, writeCdfChart } from '../src/report/index.ts';

const RUNS = Number(process.env.BENCH_RUNS ?? 120);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const NEIGHBOURS = Number(process.env.BENCH_NEIGHBOURS ?? os.availableParallelism());
const COMPUTE = "i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done";
const COMMANDS = { compute: { cmd: COMPUTE }, true: { argv: ['true'] } } as const;
type Phase = 'alone' | 'protected' | 'unprotected' | 'refilling';
const PHASES: Phase[] = ['alone', 'protected', 'unprotected', 'refilling'];
/** Larger than what a phase can refill: the pool is still refilling when the phase ends. */
const REFILL_POOL_SIZE = 500;
/** The refilling phase measures for at least this long, so many pool sandboxes start beside the probe. */
const REFILL_PHASE_MIN_MS = 5000;

const guardEnv = Object.fromEntries(Object.entries(process.env).filter((e): e is [string, string] => e[0].startsWith('ROLLBOX_BESTEFFORT_') && e[1] !== undefined));
const guardConfig = loadConfig({}, guardEnv).node;
const cluster = await startTestCluster({ workers: [{ nodeId: 'bench-node', env: guardEnv }] });
/** CPU time (ns) used so far by the worker's sandboxes of one class (their cgroup tree). */
const classCpuNs = (root: 'rollbox' | 'rollbox-besteffort'): number => {
  try {
    return Number(readFileSync(`/sys/fs/cgroup/cpuacct/${root}/bench-node/cpuacct.usage`, 'utf8'));
  } catch {
    return NaN; // no cgroup v1 cpuacct hierarchy here
  }
};
// Ctrl-C still removes every container, mount and process the bench started.
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));
try {
  const token = await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec', 'sandbox:read']);
  const admin = await cluster.token('ops', ['admin']);
  const create = async (body: object): Promise<string> => {
    const r = await api(cluster, token, 'POST', '/v1/sandboxes', body);
    if (r.status !== 201) throw new Error(`create failed: ${r.status} ${JSON.stringify(r.body)}`);
    return r.body.id;
  };
  const exec = async (id: string, body: object) => {
    const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, body);
    // 202: a background command was started.
    if ((r.status !== 200 && r.status !== 202) || (r.status === 200 && r.body.exitCode !== 0)) throw new Error(`exec failed: ${r.status} ${JSON.stringify(r.body)}`);
    return r.body;
  };
  const probe = await create({ class: 'latency', resources: { memoryMiB: 64, cpuMillis: 1000 } });
  for (let i = 0; i < 10; i++) for (const body of Object.values(COMMANDS)) await exec(probe, body);

  /** One busy loop per core, each in its own sandbox of `cls`; resolves once they all burn. */
  async function startNeighbours(cls: 'besteffort' | 'latency'): Promise<string[]> {
    const ids = await Promise.all(Array.from({ length: NEIGHBOURS }, () => create({ class: cls, resources: { memoryMiB: 32, cpuMillis: 1000 } })));
    await Promise.all(ids.map((id) => exec(id, { cmd: 'while :; do :; done', background: true, timeoutMs: 3_600_000 })));
    await new Promise((r) => setTimeout(r, 300)); // let the loops reach full speed
    return ids;
  }
  const stopNeighbours = (ids: string[]) => Promise.all(ids.map((id) => api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)));
  /** A pool the host refills for the whole phase (a new version each round, so it starts from empty). */
  const poolSandboxes = async () => {
    const { status } = (await api(cluster, admin, 'GET', '/v1/pools/refill')).body as { status: { ready: number; starting: number } };
    return status.ready + status.starting;
  };
  const startRefill = async (round: number) => {
    const put = await api(cluster, admin, 'PUT', '/v1/pools/refill', { size: REFILL_POOL_SIZE, diskMiB: 64, resources: { memoryMiB: 16 + round, cpuMillis: 50 } });
    if (put.status !== 200) throw new Error(`pool put failed: ${put.status} ${JSON.stringify(put.body)}`);
    // Measured only once the host is at it.
    for (const until = Date.now() + 30_000; (await poolSandboxes()) === 0 && Date.now() < until; ) await new Promise((r) => setTimeout(r, 100));
  };
  /** Sandboxes the pool got during the phase (as the next heartbeats tell), then the pool is gone (its sandboxes with it). */
  const stopRefill = async () => {
    await new Promise((r) => setTimeout(r, 2 * Number(process.env.ROLLBOX_HEARTBEAT_MS ?? 200)));
    const count = await poolSandboxes();
    await api(cluster, admin, 'DELETE', '/v1/pools/refill');
    return count;
  };
  const refilled: number[] = [];

  const samples: Record<Phase, Record<keyof typeof COMMANDS, number[]>> = {
    alone: { compute: [], true: [] },
    protected: { compute: [], true: [] },
    unprotected: { compute: [], true: [] },
    refilling: { compute: [], true: [] },
  };
  const perRound = Math.ceil(RUNS / ROUNDS);
  /** Per round: the neighbours' CPU use while the probe ran, in cores. */
  const neighbourCpu = { protected: [] as number[], unprotected: [] as number[] };
  for (let round = 1; round <= ROUNDS; round++) {
    for (const phase of PHASES) {
      // Deleting a neighbour ends its busy loop (and the background command running it).
      const neighbours = phase === 'protected' || phase === 'unprotected' ? await startNeighbours(phase === 'protected' ? 'besteffort' : 'latency') : [];
      if (phase === 'refilling') await startRefill(round);
      const bar = progressBar(`round ${round}/${ROUNDS} ${phase}`, { total: perRound });
      const tree = phase === 'protected' ? 'rollbox-besteffort' : 'rollbox';
      const cpuBefore = classCpuNs(tree);
      const wallBefore = performance.now();
      try {
        const minMs = phase === 'refilling' ? REFILL_PHASE_MIN_MS : 0;
        for (let i = 0; i < perRound || performance.now() - wallBefore < minMs; i++) {
          for (const [name, body] of Object.entries(COMMANDS) as [keyof typeof COMMANDS, object][]) samples[phase][name].push(await timed(() => exec(probe, body)));
          if (minMs === 0) bar.tick();
          else bar.update(Math.min(1, Math.max((i + 1) / perRound, (performance.now() - wallBefore) / minMs)), `${i + 1} runs`);
        }
        // Unprotected neighbours share the latency tree with the probe, whose own share is small.
        if (phase === 'protected' || phase === 'unprotected') neighbourCpu[phase].push((classCpuNs(tree) - cpuBefore) / 1e6 / (performance.now() - wallBefore));
      } finally {
        bar.done();
        await stopNeighbours(neighbours);
        if (phase === 'refilling') refilled.push(await stopRefill());
      }
    }
  }
  await api(cluster, token, 'DELETE', `/v1/sandboxes/${probe}`);

  const stats = Object.fromEntries(
    PHASES.map((phase) => [phase, { compute: summarize(samples[phase].compute), true: summarize(samples[phase].true) }]),
  ) as Record<Phase, Record<keyof typeof COMMANDS, ReturnType<typeof summarize>>>;
  const pct = (x: number, base: number) => Math.round((x / base - 1) * 1000) / 10;
  const ratio = (x: number, base: number) => Math.round((x / base) * 100) / 100;
  const charts = (Object.keys(COMMANDS) as (keyof typeof COMMANDS)[]).map((name) =>
    writeCdfChart(
      path.resolve(import.meta.dirname, 'out', `interference-${name}.svg`),
      `exec round trip of a latency sandbox (${name === 'compute' ? '2000-step shell loop' : 'true'}), ${NEIGHBOURS} busy neighbours`,
      [
        { label: 'alone', samplesMs: samples.alone[name] },
        { label: 'besteffort neighbours (protected)', samplesMs: samples.protected[name] },
        { label: 'latency neighbours (unprotected)', samplesMs: samples.unprotected[name] },
        { label: 'a warm pool refilling', samplesMs: samples.refilling[name] },
      ],
    ),
  );
  for (const name of Object.keys(COMMANDS) as (keyof typeof COMMANDS)[]) {
    const [a, p, u, r] = PHASES.map((phase) => stats[phase][name]);
    process.stderr.write(
      `${name.padEnd(8)} p50/p99 ms: alone ${a!.p50Ms}/${a!.p99Ms}  protected ${p!.p50Ms}/${p!.p99Ms} (+${pct(p!.p50Ms, a!.p50Ms)}%)  unprotected ${u!.p50Ms}/${u!.p99Ms} (+${pct(u!.p50Ms, a!.p50Ms)}%)  refilling ${r!.p50Ms}/${r!.p99Ms} (+${pct(r!.p50Ms, a!.p50Ms)}%)\n`,
    );
  }
  process.stderr.write(`neighbour CPU while the probe ran (cores): protected ${neighbourCpu.protected.map((c) => c.toFixed(2)).join(' ')}, unprotected ${neighbourCpu.unprotected.map((c) => c.toFixed(2)).join(' ')}\n`);
  process.stderr.write(`charts: ${charts.join(' ')}\n`);
  const { alone, protected: prot, unprotected, refilling } = stats;
  console.log(
    JSON.stringify({
      bench: 'interference',
      command: 'compute',
      p50Ms: prot.compute.p50Ms,
      p99Ms: prot.compute.p99Ms,
      floorP50Ms: alone.compute.p50Ms,
      floorP99Ms: alone.compute.p99Ms,
      ratioP50: ratio(prot.compute.p50Ms, alone.compute.p50Ms),
      unprotectedP50Ms: unprotected.compute.p50Ms,
      unprotectedP99Ms: unprotected.compute.p99Ms,
      unprotectedRatioP50: ratio(unprotected.compute.p50Ms, alone.compute.p50Ms),
      protectedIncreasePct: pct(prot.compute.p50Ms, alone.compute.p50Ms),
      unprotectedIncreasePct: pct(unprotected.compute.p50Ms, alone.compute.p50Ms),
      protectedIncreaseP99Pct: pct(prot.compute.p99Ms, alone.compute.p99Ms),
      unprotectedIncreaseP99Pct: pct(unprotected.compute.p99Ms, alone.compute.p99Ms),
      /** A warm pool refilling throughout (sandboxes it got per round's phase). */
      refilling: {
        p50Ms: refilling.compute.p50Ms,
        p99Ms: refilling.compute.p99Ms,
        increasePct: pct(refilling.compute.p50Ms, alone.compute.p50Ms),
        increaseP99Pct: pct(refilling.compute.p99Ms, alone.compute.p99Ms),
        trueIncreasePct: pct(refilling.true.p50Ms, alone.true.p50Ms),
        poolSandboxesStartedPerPhase: refilled,
      },
      true: {
        p50Ms: prot.true.p50Ms,
        p99Ms: prot.true.p99Ms,
        floorP50Ms: alone.true.p50Ms,
        unprotectedP50Ms: unprotected.true.p50Ms,
        protectedIncreasePct: pct(prot.true.p50Ms, alone.true.p50Ms),
        unprotectedIncreasePct: pct(unprotected.true.p50Ms, alone.true.p50Ms),
      },
      neighbours: NEIGHBOURS,
      neighbourCpuCores: {
        protected: Math.round((neighbourCpu.protected.reduce((a, b) => a + b, 0) / ROUNDS) * 100) / 100,
        unprotected: Math.round((neighbourCpu.unprotected.reduce((a, b) => a + b, 0) / ROUNDS) * 100) / 100,
      },
      besteffortHoldMs: guardConfig.besteffortHoldMs,
      besteffortHeldCpuMillis: guardConfig.besteffortHeldCpuMillis,
      n: prot.compute.n,
      targets: { protectedIncreasePct: 20 },
      charts,
    }),
  );
} finally {
  await cluster.stop();
}
