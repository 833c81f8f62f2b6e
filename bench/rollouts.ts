/**
 * bench:rollouts — the trainer's shape: K rollouts, each a sandbox driven through T
 * dependent turns (each command reads what the previous one wrote), CONCURRENCY rollouts
 * at a time, over two worker hosts, all through the HTTP API. Reports exec latency
 * (p50/p99), turns per second and create latency; prints progress on stderr, writes a CDF
 * chart to bench/out/, ends with one JSON line.
 *
 * BENCH_FAULT=1: a third of the way in, worker host bench-a is SIGKILLed and started again
 * BENCH_FAULT_RESTART_MS (6000) later, as a crash and a supervisor's restart would; the
 * gateways keep their defaults (a silent host stale after 5 s, lost after 30 s). Each turn checks that the log
 * holds exactly its turns (a command that ran twice shows); the JSON counts rollouts that
 * ended ok, turns answered `result_unknown`, and other failures.
 */
import type { ChildProcess } from 'node:child_process';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { api, startTestCluster, waitFor } from '../test/support/cluster.ts';
import { jsonClient } from './support/http.ts';
import { timed } from './support/runc-floor.ts';
import { progressBar, summarize, writeCdfChart } from '../src/report/index.ts';

const ROLLOUTS = Number(process.env.BENCH_ROLLOUTS ?? 60);
const TURNS = Number(process.env.BENCH_TURNS ?? 10);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 8);
const FAULT = process.env.BENCH_FAULT === '1';
const FAULT_RESTART_MS = Number(process.env.BENCH_FAULT_RESTART_MS ?? 6000);

// Worker hosts as their own processes, as deployed: this process holds the trainer (the
// HTTP client) and the gateway.
const silence: Record<string, string> = FAULT ? { ROLLBOX_NODE_STALE_AFTER_MS: '5000', ROLLBOX_NODE_LOST_AFTER_MS: '30000' } : { ROLLBOX_NODE_LOST_AFTER_MS: '5000' };
const cluster = await startTestCluster({ env: { ROLLBOX_HEARTBEAT_MS: '1000', ...silence } });
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));
try {
  const workers = new Map<string, ChildProcess>();
  for (const nodeId of ['bench-a', 'bench-b']) workers.set(nodeId, await cluster.spawnWorker({ nodeId }));
  const failures = new Map<string, number>();
  let rolloutsOk = 0;
  let turnsDone = 0;
  const token = await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec', 'admin']);
  await waitFor('both worker hosts', async () => (await api(cluster, token, 'GET', '/v1/nodes')).body.nodes?.length === 2);
  const call = jsonClient(cluster.url, token);
  const execMs: number[] = [];
  const createMs: number[] = [];
  const hops = new Map<string, number[]>();
  const bar = progressBar(`rollouts (x${CONCURRENCY})`, { total: ROLLOUTS * TURNS });

  const rollout = async (k: number) => {
    let id = '';
    createMs.push(
      await timed(async () => {
        const r = await call('POST', '/v1/sandboxes', { resources: { memoryMiB: 128, cpuMillis: 500 }, labels: { rollout: String(k) } });
        if (r.status !== 201) throw new Error(`create failed: ${r.status} ${JSON.stringify(r.body)}`);
        id = r.body.id;
      }),
    );
    for (let turn = 1; turn <= TURNS; turn++) {
      // Each turn builds on the last: the agent edits a file and checks what it holds.
      const cmd = `cd /root && echo "step ${turn}" >> work.log && wc -l < work.log && tail -n 1 work.log`;
      let body: { exitCode: number; stdout: string } = { exitCode: -1, stdout: '' };
      execMs.push(
        await timed(async () => {
          const r = await call('POST', `/v1/sandboxes/${id}/exec`, { cmd, commandId: `r${k}-t${turn}` });
          if (r.status !== 200 && FAULT) throw new TurnFailed(r.body?.error?.code ?? `http_${r.status}`);
          if (r.status !== 200) throw new Error(`exec failed: ${r.status} ${JSON.stringify(r.body)}`);
          body = r.body;
          for (const entry of String(r.headers['server-timing'] ?? '').split(',')) {
            const m = /^([a-z]+);dur=([\d.]+)/.exec(entry.trim());
            if (m) hops.set(m[1]!, [...(hops.get(m[1]!) ?? []), Number(m[2])]);
          }
        }),
      );
      if (body.exitCode !== 0 || body.stdout !== `${turn}\nstep ${turn}\n`) {
        if (FAULT) throw new TurnFailed('wrong_turn');
        throw new Error(`turn ${turn} of rollout ${k} saw ${JSON.stringify(body)}`);
      }
      turnsDone++;
      bar.tick();
    }
    await call('DELETE', `/v1/sandboxes/${id}`);
    rolloutsOk++;
  };
  /** In a fault run a failed turn ends its rollout, counted by its code. */
  const rolloutCounted = async (k: number) => {
    try {
      await rollout(k);
    } catch (err) {
      if (!(err instanceof TurnFailed)) throw err;
      failures.set(err.code, (failures.get(err.code) ?? 0) + 1);
    }
  };
  const fault = FAULT
    ? (async () => {
        await waitFor('a third of the turns', async () => turnsDone >= (ROLLOUTS * TURNS) / 3, 600_000);
        const victim = workers.get('bench-a')!;
        const exited = new Promise((resolve) => victim.once('exit', resolve));
        victim.kill('SIGKILL');
        await exited;
        await new Promise((r) => setTimeout(r, FAULT_RESTART_MS));
        workers.set('bench-a', await cluster.spawnWorker({ nodeId: 'bench-a' }));
      })()
    : Promise.resolve();

  let next = 0;
  const elu = performance.eventLoopUtilization();
  const started = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < ROLLOUTS) await rolloutCounted(next++);
    }),
  );
  await fault;
  const wallMs = performance.now() - started;
  const busy = performance.eventLoopUtilization(elu).utilization;
  bar.done();

  const e = summarize(execMs);
  const c = summarize(createMs);
  const chart = writeCdfChart(path.resolve(import.meta.dirname, 'out', 'rollouts-latency.svg'), `${ROLLOUTS} rollouts x ${TURNS} turns, ${CONCURRENCY} at once`, [
    { label: 'exec (HTTP)', samplesMs: execMs },
    { label: 'create (HTTP)', samplesMs: createMs },
  ]);
  process.stderr.write(`chart: ${chart}\n`);
  console.log(
    JSON.stringify({
      bench: 'rollouts',
      rollouts: ROLLOUTS,
      turns: TURNS,
      concurrency: CONCURRENCY,
      workers: 2,
      execP50Ms: e.p50Ms,
      execP99Ms: e.p99Ms,
      createP50Ms: c.p50Ms,
      createP99Ms: c.p99Ms,
      /** Median milliseconds per hop of an exec (Server-Timing). */
      execHopsP50Ms: Object.fromEntries([...hops].map(([hop, ms]) => [hop, summarize(ms).p50Ms])),
      turnsPerSecond: Math.round(((ROLLOUTS * TURNS) / wallMs) * 1000 * 10) / 10,
      wallSeconds: Math.round(wallMs / 100) / 10,
      /** Share of the run this process's event loop (the client and the gateway) was busy. */
      eventLoopUtilization: Math.round(busy * 100) / 100,
      targets: { execP50Ms: 30 },
      ...(FAULT ? { fault: { killed: 'bench-a', restartAfterMs: FAULT_RESTART_MS, rolloutsOk, failedTurnsByCode: Object.fromEntries(failures), resultUnknown: failures.get('result_unknown') ?? 0 } } : {}),
      chart,
    }),
  );
} finally {
  await cluster.stop();
}

class TurnFailed extends Error {
  constructor(readonly code: string) {
    super(code);
  }
}
