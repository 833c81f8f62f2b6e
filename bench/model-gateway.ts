/**
 * bench:model-gateway — the time the model gateway adds to a model call: an agent's chat
 * completion (plain, and streamed to its last event) sent through a gateway (its own
 * process, as in production) to a scripted upstream on loopback, against the same call
 * sent to the upstream directly, the two arms interleaved in the same run. Also the
 * Redis calls a model call costs. Prints progress on stderr, ends with one JSON line.
 */
import { readFileSync } from 'node:fs';
import os from 'node:os';
import { Redis } from 'ioredis';
import { RolloutKeyStore } from '../src/iam/index.ts';
import { progressBar, summarize } from '../src/report/index.ts';
import { api, startTestCluster } from '../test/support/cluster.ts';
import { ScriptedUpstream } from '../test/support/model-upstream.ts';
import { callsPerOperation } from './support/redis-calls.ts';

const RUNS = Number(process.env.BENCH_RUNS ?? 400);
const WARMUP = 50;
/** A turn as an agent gets it: some text and a tool call, streamed in 4-character pieces (about 25 events). */
const SCRIPT = [{ text: 'I will list the files first.', toolCalls: [{ name: 'bash', arguments: { cmd: 'ls -la /workspace' } }] }];

const cluster = await startTestCluster({ env: { ROLLBOX_HEARTBEAT_MS: '1000', ROLLBOX_NODE_LOST_AFTER_MS: '5000' } });
const redis = new Redis(cluster.redisUrl);
const upstream = await ScriptedUpstream.start({ script: SCRIPT });
process.once('SIGINT', () => void Promise.all([upstream.stop(), cluster.stop()]).finally(() => process.exit(130)));
try {
  // BENCH_IN_PROCESS=1: the test cluster's own gateway, in this process (for a CPU profile of one process).
  // BENCH_PROFILE_DIR=dir: the spawned gateway writes a CPU profile there when the bench ends.
  const profile = process.env.BENCH_PROFILE_DIR ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_PROFILE_DIR}`] : undefined;
  const gateway = process.env.BENCH_IN_PROCESS === '1' ? { url: cluster.url, child: undefined } : await cluster.spawnGateway({ name: 'bench-gw', ...(profile ? { nodeArgs: profile } : {}) });
  /** The gateway process's CPU time so far (user + system), ms: what a call costs it, whatever else loads the machine. */
  const gatewayCpuMs = () => {
    if (!gateway.child?.pid) return NaN;
    const fields = readFileSync(`/proc/${gateway.child.pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100;
  };
  const trainer = await cluster.token('bench', ['rollout:submit']);
  const bound = await api(cluster, trainer, 'PUT', '/v1/jobs/bench-job/model', { upstreams: [{ baseUrl: upstream.url }], headers: { authorization: 'Bearer sk-bench' } });
  if (bound.status !== 200) throw new Error(`binding failed: ${bound.status} ${JSON.stringify(bound.body)}`);
  const key = await new RolloutKeyStore(redis).issue({ tenant: 'bench', rolloutId: 'ro-bench', job: 'bench-job', ttlSeconds: 3600 });
  const viaGateway = `${gateway.url}/v1/rollouts/ro-bench/model/v1`;

  let n = 0;
  /** One call to its last byte (a new body each time, as an agent's turns are). */
  const call = async (base: string, stream: boolean) => {
    const body = JSON.stringify({ model: 'm', stream, messages: [{ role: 'user', content: `turn ${++n}: fix the failing test` }] });
    const started = performance.now();
    const res = await fetch(`${base}/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body });
    const text = await res.text();
    const ms = performance.now() - started;
    if (res.status !== 200 || !text.includes(stream ? '[DONE]' : 'ls -la')) throw new Error(`call failed: ${res.status} ${text.slice(0, 300)}`);
    return ms;
  };
  const arms = { direct: [] as number[], gateway: [] as number[], directStream: [] as number[], gatewayStream: [] as number[], hop: [] as number[], redisWake: [] as number[] };
  /**
   * A Redis round trip after Redis sat idle for a few milliseconds, as it does between a
   * call's two round trips (its join, and its record): on a busy machine, waking a process
   * that slept costs more than the round trip itself.
   */
  const redisWake = async () => {
    await new Promise((r) => setTimeout(r, 3));
    const started = performance.now();
    await redis.ping();
    return performance.now() - started;
  };
  /** A floor for the gateway arm: one round trip to the gateway process and back (`/healthz`: no auth, no Redis). */
  const hop = async () => {
    const started = performance.now();
    await (await fetch(`${gateway.url}/healthz`)).text();
    return performance.now() - started;
  };
  for (let i = 0; i < WARMUP; i++) for (const stream of [false, true]) for (const base of [upstream.url, viaGateway]) await call(base, stream);
  const bar = progressBar('model calls, direct and through the gateway', { total: RUNS });
  const cpuBefore = gatewayCpuMs();
  for (let i = 0; i < RUNS; i++) {
    // Interleaved, the order alternating, so both arms see the same machine.
    const order = i % 2 ? [true, false] : [false, true];
    for (const gw of order) {
      (gw ? arms.gateway : arms.direct).push(await call(gw ? viaGateway : upstream.url, false));
      (gw ? arms.gatewayStream : arms.directStream).push(await call(gw ? viaGateway : upstream.url, true));
    }
    arms.hop.push(await hop());
    arms.redisWake.push(await redisWake());
    bar.tick();
  }
  bar.done();
  // (The /healthz round trips' CPU is in it too; small beside a model call's.)
  const cpuPerCallMs = Math.round(((gatewayCpuMs() - cpuBefore) / (2 * RUNS)) * 100) / 100;
  // What the gateway spends doing nothing (its timers, heartbeats read, janitor), for the same span: not the calls'.
  const idleFrom = gatewayCpuMs();
  await new Promise((r) => setTimeout(r, 3000));
  const idleCpuMsPerSecond = Math.round(((gatewayCpuMs() - idleFrom) / 3) * 100) / 100;
  process.stderr.write('redis calls per model call...\n');
  const redisCallsPerCall = await callsPerOperation(redis, 100, () => call(viaGateway, false));
  const redisCallsPerStreamedCall = await callsPerOperation(redis, 100, () => call(viaGateway, true));

  const [d, g, ds, gs, h, w] = [summarize(arms.direct), summarize(arms.gateway), summarize(arms.directStream), summarize(arms.gatewayStream), summarize(arms.hop), summarize(arms.redisWake)];
  const round = (x: number) => Math.round(x * 100) / 100;
  console.log(
    JSON.stringify({
      bench: 'model-gateway',
      /** Time added per call: the gateway arm's percentile less the direct arm's. */
      addedP50Ms: round(g.p50Ms - d.p50Ms),
      addedP99Ms: round(g.p99Ms - d.p99Ms),
      addedStreamP50Ms: round(gs.p50Ms - ds.p50Ms),
      addedStreamP99Ms: round(gs.p99Ms - ds.p99Ms),
      gatewayP50Ms: g.p50Ms,
      gatewayP99Ms: g.p99Ms,
      directP50Ms: d.p50Ms,
      directP99Ms: d.p99Ms,
      gatewayStreamP50Ms: gs.p50Ms,
      directStreamP50Ms: ds.p50Ms,
      /** A round trip to the gateway process alone (GET /healthz), in the same run: what any route through a second process costs here. */
      gatewayHopP50Ms: h.p50Ms,
      /** A Redis round trip after 3 ms idle, in the same run (a model call makes two: its join and its record). */
      redisWakeP50Ms: w.p50Ms,
      /** The machine's load average (1 min) when the bench ended: a loaded machine inflates every hop. */
      loadAverage: Math.round(os.loadavg()[0]! * 10) / 10,
      /** The gateway's CPU per call (a plain and a streamed one, averaged), from /proc: independent of the machine's load. */
      gatewayCpuMsPerCall: cpuPerCallMs,
      gatewayIdleCpuMsPerSecond: idleCpuMsPerSecond,
      redisCallsPerCall,
      redisCallsPerStreamedCall,
      n: g.n,
      targets: { addedP50Ms: 2 },
    }),
  );
  if (profile && gateway.child) {
    gateway.child.kill('SIGTERM');
    await new Promise((r) => gateway.child!.once('exit', r));
  }
} finally {
  redis.disconnect();
  await upstream.stop();
  await cluster.stop();
}
