/**
 * bench:cluster — the same stack (one gateway, one worker host) on one redis-server and on
 * a Redis Cluster of 3 primaries with a replica each, on this machine, one after the
 * other: execs/s and creates/s at a fixed concurrency, Redis calls and Redis CPU per
 * operation (INFO commandstats of the primaries and INFO cpu of every redis-server of the
 * deployment, replicas included, each less the idle background over the same time). The one-Redis run is the reference the cluster's
 * figures are divided by. On one machine a cluster cannot be faster (its shards share the
 * same cores): what it shows is what sharding costs per operation; docs/operations.md
 * turns calls per operation into the shards the seed's rates need.
 * Prints progress on stderr, writes a latency chart to bench/out/, ends with one JSON line.
 */
import path from 'node:path';
import { Redis } from 'ioredis';
import { api, startTestCluster, type TestCluster } from '../test/support/cluster.ts';
import { redisCallsSoFar } from './support/redis-calls.ts';
import { progressBar, summarize, writeCdfChart } from '../src/report/index.ts';

const EXECS = Number(process.env.BENCH_EXECS ?? 600);
const CREATES = Number(process.env.BENCH_CREATES ?? 80);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 8);
const SANDBOXES = 4;

interface Meter {
  calls: number;
  cpuSeconds: number;
}

interface Servers {
  all: Redis[];
  /** Where commands are counted (a replica counts the commands it replays too). */
  primaries: Redis[];
}

/** Every redis-server of the deployment (one, or each cluster node). */
async function serversOf(cluster: TestCluster): Promise<Servers> {
  if (!cluster.redisCluster) {
    const one = new Redis(Number(new URL(cluster.redisUrl).port), '127.0.0.1');
    return { all: [one], primaries: [one] };
  }
  const nodes = await cluster.redisCluster.nodes();
  const all = nodes.map((n) => new Redis(n.port, '127.0.0.1'));
  return { all, primaries: all.filter((_, i) => nodes[i]!.role === 'primary') };
}

async function meter(servers: Servers): Promise<Meter> {
  let calls = 0;
  let cpuSeconds = 0;
  for (const server of servers.primaries) calls += await redisCallsSoFar(server);
  for (const server of servers.all) {
    const cpu = await server.info('cpu');
    for (const field of ['used_cpu_sys', 'used_cpu_user']) cpuSeconds += Number(new RegExp(`^${field}:([0-9.]+)`, 'm').exec(cpu)?.[1] ?? 0);
  }
  return { calls, cpuSeconds };
}

/** Redis calls and CPU seconds per second while only the stack's background runs (heartbeats, janitor, BullMQ's polling). */
async function background(servers: Servers, windowMs = 3000): Promise<Meter> {
  const before = await meter(servers);
  await new Promise((r) => setTimeout(r, windowMs));
  const after = await meter(servers);
  return { calls: ((after.calls - before.calls) * 1000) / windowMs, cpuSeconds: ((after.cpuSeconds - before.cpuSeconds) * 1000) / windowMs };
}

/** `n` operations at CONCURRENCY: latencies, operations per second, Redis calls and CPU µs per operation (background subtracted). */
async function phase(label: string, servers: Servers, n: number, op: (i: number) => Promise<void>) {
  const idle = await background(servers);
  const bar = progressBar(label, { total: n });
  const samplesMs: number[] = [];
  const before = await meter(servers);
  const started = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < n) {
        const i = next++;
        const t = performance.now();
        await op(i);
        samplesMs.push(performance.now() - t);
        bar.tick();
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  const after = await meter(servers);
  bar.done();
  return {
    samplesMs,
    perSecond: Math.round((n / seconds) * 10) / 10,
    redisCallsPerOp: Math.round(((after.calls - before.calls - idle.calls * seconds) / n) * 10) / 10,
    redisCpuUsPerOp: Math.round(((after.cpuSeconds - before.cpuSeconds - idle.cpuSeconds * seconds) / n) * 1e6),
  };
}

async function run(kind: 'single' | 'cluster') {
  process.stderr.write(`--- ${kind === 'single' ? 'one redis-server' : 'Redis Cluster, 3 primaries + 3 replicas'}\n`);
  const cluster = await startTestCluster({
    redisCluster: kind === 'cluster',
    workers: [{ nodeId: `bench-${kind}`, env: { ROLLBOX_NODE_MAX_STARTING: String(CONCURRENCY * 2) } }],
    env: { ROLLBOX_HEARTBEAT_MS: '1000', ROLLBOX_NODE_LOST_AFTER_MS: '5000' },
  });
  const servers = await serversOf(cluster);
  const stopOnSigint = () => void cluster.stop().finally(() => process.exit(130));
  process.once('SIGINT', stopOnSigint);
  try {
    const token = await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec']);
    const create = async () => {
      const r = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 32, cpuMillis: 100 } });
      if (r.status !== 201) throw new Error(`create failed: ${r.status} ${JSON.stringify(r.body)}`);
      return r.body.id as string;
    };
    const sandboxes = await Promise.all(Array.from({ length: SANDBOXES }, create));
    for (const id of sandboxes) await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { argv: ['true'] }); // warm-up
    const execs = await phase(`execs (x${CONCURRENCY})`, servers, EXECS, async (i) => {
      const r = await api(cluster, token, 'POST', `/v1/sandboxes/${sandboxes[i % SANDBOXES]}/exec`, { argv: ['echo', String(i)] });
      if (r.status !== 200) throw new Error(`exec failed: ${r.status} ${JSON.stringify(r.body)}`);
    });
    const made: string[] = [];
    const creates = await phase(`creates (x${CONCURRENCY})`, servers, CREATES, async () => void made.push(await create()));
    const deletes = progressBar('deletes', { total: made.length + SANDBOXES });
    for (const id of [...made, ...sandboxes]) {
      await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
      deletes.tick();
    }
    deletes.done();
    return { execs, creates };
  } finally {
    process.off('SIGINT', stopOnSigint);
    for (const server of servers.all) server.disconnect();
    await cluster.stop();
  }
}

const single = await run('single');
const sharded = await run('cluster');
const ratio = (a: number, b: number) => Math.round((a / b) * 100) / 100;
const chart = writeCdfChart(path.resolve(import.meta.dirname, 'out', 'cluster-latency.svg'), `exec and create latency, one Redis and a 3-primary cluster (x${CONCURRENCY})`, [
  { label: 'exec, one redis-server', samplesMs: single.execs.samplesMs },
  { label: 'exec, Redis Cluster', samplesMs: sharded.execs.samplesMs },
  { label: 'create, one redis-server', samplesMs: single.creates.samplesMs },
  { label: 'create, Redis Cluster', samplesMs: sharded.creates.samplesMs },
]);
process.stderr.write(`chart: ${chart}\n`);
const figures = (r: Awaited<ReturnType<typeof run>>) => ({
  execsPerSecond: r.execs.perSecond,
  execP50Ms: summarize(r.execs.samplesMs).p50Ms,
  redisCallsPerExec: r.execs.redisCallsPerOp,
  redisCpuUsPerExec: r.execs.redisCpuUsPerOp,
  createsPerSecond: r.creates.perSecond,
  createP50Ms: summarize(r.creates.samplesMs).p50Ms,
  redisCallsPerCreate: r.creates.redisCallsPerOp,
  redisCpuUsPerCreate: r.creates.redisCpuUsPerOp,
});
console.log(
  JSON.stringify({
    bench: 'cluster',
    concurrency: CONCURRENCY,
    execs: EXECS,
    creates: CREATES,
    single: figures(single),
    cluster: figures(sharded),
    /** Cluster over one Redis, in the same run. */
    ratios: {
      execsPerSecond: ratio(sharded.execs.perSecond, single.execs.perSecond),
      createsPerSecond: ratio(sharded.creates.perSecond, single.creates.perSecond),
      redisCpuPerExec: ratio(sharded.execs.redisCpuUsPerOp, single.execs.redisCpuUsPerOp),
      redisCpuPerCreate: ratio(sharded.creates.redisCpuUsPerOp, single.creates.redisCpuUsPerOp),
    },
    chart,
  }),
);
