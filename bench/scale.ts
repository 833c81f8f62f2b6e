/**
 * bench:scale — the control plane against many worker hosts: N hollow hosts (the real
 * worker host code over a runtime that starts nothing, src/workers/hollow) in child
 * processes, a real worker host beside them (runc containers, in the same host pool, with
 * room for a few sandboxes: it takes its share of creates through the same placement),
 * G gateways (`rollbox gateway`, each its own process; the bench's requests go round them)
 * and Redis (one redis-server, or a Redis Cluster of 3 primaries with a replica each with
 * --cluster), all on this machine.
 *
 * Phases: background (nothing asked), fill (M live sandboxes created at a fixed
 * concurrency: steady creates), a burst (B creates of one training job sent at once), a
 * steady exec load. Per operation: Redis calls (INFO commandstats of every primary),
 * Redis CPU (INFO cpu of every server, replicas included), gateway and worker-process CPU
 * (/proc; gateways summed), each less the background measured over the same length of time; creates/s a
 * Redis core and a gateway core would carry at that cost; create-to-running and exec
 * latency against Kubernetes' SLOs; placement quality under the burst; Redis memory per
 * live sandbox. Figures per operation do not depend on the counts: scale them with the flags.
 *
 *   npm run bench:scale -- [--hosts 50] [--hosts-per-process 100] [--gateways 2] [--real-hosts 1] [--live 2000] [--burst 1000] [--execs 2000] [--concurrency 32] [--cluster]
 *   (or BENCH_HOSTS, BENCH_HOSTS_PER_PROCESS, BENCH_GATEWAYS, BENCH_REAL_HOSTS, BENCH_LIVE, BENCH_BURST, BENCH_EXECS, BENCH_CONCURRENCY, BENCH_REDIS_CLUSTER=1;
 *   BENCH_PROFILE_DIR=dir: a CPU profile of each gateway)
 *
 * Progress on stderr; one JSON line last on stdout. One file, longer than most: its phases
 * share the processes it starts and the meters it reads them with.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { Redis } from 'ioredis';
import { loadConfig } from '../src/config/index.ts';
import { createTokenIssuer } from '../src/iam/index.ts';
import { startRedisCluster, startRedisServer } from '../src/redis/index.ts';
import { lineChartsSvg, summarize, writeCdfChart, writeSvg } from '../src/report/index.ts';
import { ensureBaseLayer } from '../src/roles/index.ts';
import { jsonClient } from './support/http.ts';
import { processCpuSeconds } from './support/proc-cpu.ts';
import { redisCallsByCommand } from './support/redis-calls.ts';

const { values: flags } = parseArgs({
  options: { hosts: { type: 'string' }, 'hosts-per-process': { type: 'string' }, gateways: { type: 'string' }, 'real-hosts': { type: 'string' }, live: { type: 'string' }, burst: { type: 'string' }, execs: { type: 'string' }, concurrency: { type: 'string' }, cluster: { type: 'boolean' } },
});
const numberOf = (flag: string | undefined, env: string, fallback: number) => Number(flag ?? process.env[env] ?? fallback);
const HOSTS = numberOf(flags.hosts, 'BENCH_HOSTS', 50);
/** Hollow hosts share a process (one event loop) this many at most: more processes spread them over the cores. */
const HOSTS_PER_PROCESS = numberOf(flags['hosts-per-process'], 'BENCH_HOSTS_PER_PROCESS', 100);
const GATEWAYS = Math.max(1, numberOf(flags.gateways, 'BENCH_GATEWAYS', 2));
/** Real worker hosts (runc) beside the hollow ones, each with room for REAL_HOST_SANDBOXES. */
const REAL_HOSTS = numberOf(flags['real-hosts'], 'BENCH_REAL_HOSTS', 1);
const REAL_HOST_SANDBOXES = 8;
const LIVE = numberOf(flags.live, 'BENCH_LIVE', 2000);
const BURST = numberOf(flags.burst, 'BENCH_BURST', 1000);
const EXECS = numberOf(flags.execs, 'BENCH_EXECS', 2000);
const CONCURRENCY = numberOf(flags.concurrency, 'BENCH_CONCURRENCY', 32);
const CLUSTER = flags.cluster ?? process.env.BENCH_REDIS_CLUSTER === '1';
/** Each host's admission limit over its fair share of every sandbox the bench makes. */
const HEADROOM = 1.5;
const SANDBOX = { memoryMiB: 64, cpuMillis: 100 };
const BACKGROUND_WINDOW_MS = 5000;
const REPO = path.resolve(import.meta.dirname, '..');
const CHARTS_DIR = path.join(import.meta.dirname, 'out');
/** Kubernetes' published SLOs: pod startup p99 (stateless, image pulled) and mutating API calls p99. */
const SLO = { podStartupP99Ms: 5000, apiCallP99Ms: 1000 };

const log = (line: string) => process.stderr.write(`${new Date().toISOString().slice(11, 19)} ${line}\n`);

interface Meter {
  atS: number;
  redisCalls: number;
  /** Calls by command name, every primary together. */
  byCommand: Map<string, number>;
  redisCpuS: number;
  gatewayCpuS: number;
  workerCpuS: number;
}
type Counted = Exclude<keyof Meter, 'atS' | 'byCommand'>;
const COUNTED: Counted[] = ['redisCalls', 'redisCpuS', 'gatewayCpuS', 'workerCpuS'];

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
    server.on('error', reject);
  });
}

async function until<T>(what: string, probe: () => Promise<T | undefined | false>, timeoutMs: number): Promise<T> {
  for (const deadline = Date.now() + timeoutMs; ; ) {
    const value = await probe().catch(() => undefined);
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

const rootDir = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-bench-scale-'));
const children: ChildProcess[] = [];
let stopRedis: (() => Promise<void>) | undefined;
const servers: { all: Redis[]; primaries: Redis[] } = { all: [], primaries: [] };

async function cleanup(): Promise<void> {
  for (const s of servers.all) s.disconnect();
  for (const child of children) {
    if (child.exitCode !== null || child.signalCode !== null) continue;
    if (child.connected) child.send({ kind: 'stop' });
    else child.kill('SIGTERM');
    const exited = new Promise((r) => child.once('exit', r));
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    await exited;
    clearTimeout(timer);
  }
  await stopRedis?.();
  await fs.rm(rootDir, { recursive: true, force: true });
}
process.once('SIGINT', () => void cleanup().finally(() => process.exit(130)));

try {
  // --- Redis, base layer, gateway, hollow hosts
  log(`starting ${CLUSTER ? 'a Redis Cluster (3 primaries + 3 replicas)' : 'one redis-server'}, ${GATEWAYS} gateway(s), ${HOSTS} hollow worker hosts and ${REAL_HOSTS} real one(s)`);
  let redisUrl: string;
  if (CLUSTER) {
    const cluster = await startRedisCluster({ dataDir: path.join(rootDir, 'redis') });
    stopRedis = cluster.stop;
    redisUrl = cluster.url;
    const nodes = await cluster.nodes();
    servers.all = nodes.map((n) => new Redis(n.port, '127.0.0.1'));
    servers.primaries = servers.all.filter((_, i) => nodes[i]!.role === 'primary');
  } else {
    const server = await startRedisServer({ dataDir: path.join(rootDir, 'redis'), persist: true });
    stopRedis = server.stop;
    redisUrl = server.url;
    servers.all = servers.primaries = [new Redis(server.port, '127.0.0.1')];
  }
  const maxSandboxes = Math.ceil(((LIVE + BURST) / HOSTS) * HEADROOM);
  const capacity = { maxSandboxes, memoryMiB: maxSandboxes * SANDBOX.memoryMiB, cpuMillis: maxSandboxes * SANDBOX.cpuMillis, maxStarting: 16 };
  const ports = await Promise.all(Array.from({ length: GATEWAYS }, freePort));
  const env: Record<string, string> = {
    ROLLBOX_POOL: 'hollow',
    ROLLBOX_LOG_LEVEL: 'warn',
    ROLLBOX_LAYER_STORE: path.join(rootDir, 'layers'),
    ROLLBOX_JWT_SECRET_FILE: path.join(rootDir, 'jwt-secret'),
    ROLLBOX_TENANT_MAX_SANDBOXES: String(10 * (LIVE + BURST)),
    REDIS_URL: redisUrl,
  };
  const config = loadConfig({}, { ...env, ROLLBOX_DATA_DIR: path.join(rootDir, 'bench') });
  await ensureBaseLayer(config, redisUrl);
  // Children log to stderr: stdout carries the one JSON line.
  // BENCH_PROFILE_DIR=dir: each gateway writes a CPU profile there when the bench ends.
  const profile = process.env.BENCH_PROFILE_DIR ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_PROFILE_DIR}`] : [];
  const gateways = ports.map((port, k) => {
    const gateway = spawn(process.execPath, [...profile, path.join(REPO, 'bin/rollbox.js'), 'gateway', '--data-dir', path.join(rootDir, `gateway-${k}`)], {
      env: { ...process.env, ...env, ROLLBOX_PORT: String(port) },
      stdio: ['ignore', 2, 'inherit'],
    });
    children.push(gateway);
    return gateway;
  });
  const urls = ports.map((port) => `http://127.0.0.1:${port}`);
  // Real hosts: in the hollow hosts' pool, so placement weighs them together; their sandboxes go with them (--destroy-on-exit).
  const realHostIds = Array.from({ length: REAL_HOSTS }, (_, k) => `real-${k}`);
  for (const nodeId of realHostIds) {
    const child = spawn(process.execPath, [path.join(REPO, 'bin/rollbox.js'), 'worker', '--data-dir', path.join(rootDir, nodeId), '--node-id', nodeId, '--destroy-on-exit'], {
      env: {
        ...process.env,
        ...env,
        ROLLBOX_NODE_MAX_SANDBOXES: String(REAL_HOST_SANDBOXES),
        ROLLBOX_NODE_MEMORY_MIB: String(REAL_HOST_SANDBOXES * SANDBOX.memoryMiB),
        ROLLBOX_NODE_CPU_MILLIS: String(REAL_HOST_SANDBOXES * SANDBOX.cpuMillis),
        ROLLBOX_SANDBOX_GATEWAY_URL: urls[0]!,
      },
      stdio: ['ignore', 2, 'inherit'],
    });
    children.push(child);
  }
  // The hosts' processes: their entry script is under bench/, the only place hollow hosts start.
  const processes = Math.ceil(HOSTS / HOSTS_PER_PROCESS);
  const hollows = Array.from({ length: processes }, (_, k) => {
    const count = Math.floor(HOSTS / processes) + (k < HOSTS % processes ? 1 : 0);
    const child = spawn(process.execPath, ['--import', 'tsx', path.join(REPO, 'bench/support/hollow-hosts.ts')], {
      env: { ...process.env, ...env, ROLLBOX_DATA_DIR: path.join(rootDir, `hollow-${k}`), HOLLOW_COUNT: String(count), HOLLOW_ID_PREFIX: `p${k}-`, HOLLOW_CAPACITY: JSON.stringify(capacity) },
      stdio: ['ignore', 2, 'inherit', 'ipc'],
    });
    children.push(child);
    return child;
  });
  const fromHollow = (hollow: ChildProcess, kind: string) =>
    new Promise<any>((resolve, reject) => {
      const onMessage = (m: any) => {
        if (m.kind !== kind) return;
        hollow.off('message', onMessage);
        hollow.off('exit', onExit);
        resolve(m);
      };
      const onExit = (code: number | null) => reject(new Error(`a hollow hosts' process exited (${code})`));
      hollow.on('message', onMessage);
      hollow.once('exit', onExit);
    });
  /** The sandboxes each hollow host holds, by node id. */
  const loads = async (): Promise<Map<string, string[]>> => {
    const answers = hollows.map((h) => fromHollow(h, 'loads'));
    for (const h of hollows) h.send({ kind: 'loads' });
    return new Map((await Promise.all(answers)).flatMap((a) => Object.entries(a.loads as Record<string, string[]>)));
  };
  const startedAt = performance.now();
  await Promise.all(hollows.map((h) => fromHollow(h, 'ready')));
  const issuer = createTokenIssuer(config.jwt);
  const adminToken = await issuer.issue({ tenant: 'bench-admin', scopes: ['admin'], ttlSeconds: 3600 });
  const admins = urls.map((url) => jsonClient(url, adminToken, 4));
  const admin = admins[0]!;
  await until(`${HOSTS} hollow hosts and ${REAL_HOSTS} real one(s) in every gateway's view`, async () => {
    for (const a of admins) {
      const r = await a('GET', '/v1/nodes');
      const up = r.status === 200 ? r.body.nodes.filter((n: any) => n.pool === 'hollow' && n.healthy && n.ready !== false) : [];
      if (up.length < HOSTS + REAL_HOSTS || !realHostIds.every((id) => up.some((n: any) => n.nodeId === id))) return false;
    }
    return true;
  }, 180_000);
  log(`up in ${Math.round(performance.now() - startedAt)} ms; each host admits ${maxSandboxes} sandboxes`);
  const benchToken = await issuer.issue({ tenant: 'bench', scopes: ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete'], ttlSeconds: 3600 });
  // A fresh client (its own keep-alive sockets) per phase: a socket left idle past the
  // gateway's keep-alive timeout between phases would be closed under a new request.
  /** Requests go round the gateways, each with its own keep-alive sockets. */
  const clientOf = (concurrency: number) => {
    const perGateway = urls.map((url) => jsonClient(url, benchToken, Math.ceil(concurrency / GATEWAYS)));
    let next = 0;
    return (method: string, route: string, body?: unknown) => perGateway[next++ % perGateway.length]!(method, route, body);
  };
  let client = clientOf(CONCURRENCY);

  // --- Meters
  const sumInfo = async (redises: Redis[], section: string, fields: string[]) => {
    let total = 0;
    for (const r of redises) {
      const text = await r.info(section);
      for (const field of fields) total += Number(new RegExp(`^${field}:([0-9.]+)`, 'm').exec(text)?.[1] ?? 0);
    }
    return total;
  };
  const meter = async (): Promise<Meter> => {
    const byCommand = new Map<string, number>();
    for (const r of servers.primaries) for (const [name, calls] of await redisCallsByCommand(r)) byCommand.set(name, (byCommand.get(name) ?? 0) + calls);
    return {
      atS: performance.now() / 1000,
      redisCalls: [...byCommand.values()].reduce((a, b) => a + b, 0),
      byCommand,
      redisCpuS: await sumInfo(servers.all, 'cpu', ['used_cpu_sys', 'used_cpu_user']),
      gatewayCpuS: gateways.reduce((sum, g) => sum + processCpuSeconds(g.pid!), 0),
      workerCpuS: hollows.reduce((sum, h) => sum + processCpuSeconds(h.pid!), 0),
    };
  };
  const rates = (before: Meter, after: Meter) => {
    const seconds = after.atS - before.atS;
    const byCommand = new Map([...after.byCommand].map(([name, calls]) => [name, (calls - (before.byCommand.get(name) ?? 0)) / seconds]));
    return { ...(Object.fromEntries(COUNTED.map((k) => [k, (after[k] - before[k]) / seconds])) as Record<Counted, number>), byCommand };
  };
  type Rates = ReturnType<typeof rates>;
  const background = async (label: string) => {
    const before = await meter();
    await new Promise((r) => setTimeout(r, BACKGROUND_WINDOW_MS));
    const rate = rates(before, await meter());
    const top = [...rate.byCommand].sort((a, b) => b[1] - a[1]).slice(0, 6).map(([name, perS]) => `${name} ${Math.round(perS)}`);
    log(`background (${label}): ${Math.round(rate.redisCalls)} Redis calls/s (${top.join(', ')}), Redis ${pct(rate.redisCpuS)}, gateway ${pct(rate.gatewayCpuS)}, hosts ${pct(rate.workerCpuS)} of a core`);
    return rate;
  };
  /**
   * Waits until Redis sees no new connections (at most a minute): hosts report ready before
   * all their connections are open, and at 500 hosts the rest (HELLO, CLUSTER INFO: hundreds
   * a second, and the hosts' CPU with them) would count in the idle background, which the
   * fill's figures are measured against.
   */
  const settled = async () => {
    const connections = () => sumInfo(servers.all, 'stats', ['total_connections_received']);
    let before = await connections();
    for (const deadline = Date.now() + 60_000; Date.now() < deadline; ) {
      await new Promise((r) => setTimeout(r, BACKGROUND_WINDOW_MS));
      const now = await connections();
      if (now === before) return;
      log(`waiting for the hosts' start-up: ${now - before} new Redis connections in the last ${BACKGROUND_WINDOW_MS / 1000} s`);
      before = now;
    }
  };
  const pct = (cores: number) => `${Math.round(cores * 100)}%`;
  const refusalsSoFar = async () => {
    let total = 0;
    for (const a of admins) {
      const text = (await a('GET', '/metrics')).body as string;
      for (const m of text.matchAll(/^rollbox_placement_refusals_total\{[^}]*\} (\d+)/gm)) total += Number(m[1]);
    }
    return total;
  };
  /** What each real host's heartbeat says it holds. */
  const realHostLoads = async (): Promise<Map<string, number>> => {
    const nodes = (await admin('GET', '/v1/nodes')).body.nodes as { nodeId: string; sandboxes: number }[];
    return new Map(realHostIds.map((id) => [id, nodes.find((n) => n.nodeId === id)?.sandboxes ?? -1]));
  };
  const redisMemoryBytes = () => sumInfo(servers.primaries, 'memory', ['used_memory']);

  /** Each phase's latencies, for the chart. */
  const samplesOf = new Map<string, number[]>();
  /** `n` operations, `concurrency` at a time: latencies, outcomes, and costs per operation less the background. */
  const phase = async (label: string, n: number, concurrency: number, idle: Rates, op: (i: number) => Promise<string>) => {
    const samplesMs: number[] = [];
    samplesOf.set(label, samplesMs);
    const outcomes: Record<string, number> = {};
    let done = 0;
    let next = 0;
    const before = await meter();
    const progress = setInterval(() => log(`${label}: ${done}/${n} (${Math.round(done / (performance.now() / 1000 - before.atS))}/s)`), 2000);
    try {
      await Promise.all(
        Array.from({ length: Math.min(concurrency, n) }, async () => {
          while (next < n) {
            const i = next++;
            const t = performance.now();
            const outcome = await op(i).catch((err: unknown) => `client_error: ${String(err)}`);
            samplesMs.push(performance.now() - t);
            outcomes[outcome] = (outcomes[outcome] ?? 0) + 1;
            done++;
          }
        }),
      );
    } finally {
      clearInterval(progress);
    }
    const after = await meter();
    const seconds = after.atS - before.atS;
    const perOp = (k: Counted) => (after[k] - before[k] - idle[k] * seconds) / n;
    const latency = summarize(samplesMs);
    // Calls per operation by command, less the background's; what is left under 0.05 is noise.
    const callsByCommand = Object.fromEntries(
      [...after.byCommand]
        .map(([name, calls]) => [name, round((calls - (before.byCommand.get(name) ?? 0) - (idle.byCommand.get(name) ?? 0) * seconds) / n, 2)] as const)
        .filter(([, perOp]) => perOp >= 0.05)
        .sort((a, b) => b[1] - a[1]),
    );
    const figures = {
      n,
      concurrency,
      seconds: round(seconds, 2),
      perSecond: round(n / seconds, 1),
      outcomes,
      latency,
      redisCallsPerOp: round(perOp('redisCalls'), 1),
      callsByCommand,
      redisCpuUsPerOp: Math.round(perOp('redisCpuS') * 1e6),
      gatewayCpuUsPerOp: Math.round(perOp('gatewayCpuS') * 1e6),
      workerCpuUsPerOp: Math.round(perOp('workerCpuS') * 1e6),
      /** Cores busy over the phase, background included. */
      coresBusy: Object.fromEntries(COUNTED.filter((k) => k !== 'redisCalls').map((k) => [k.replace('CpuS', ''), round((after[k] - before[k]) / seconds, 2)])),
    };
    log(`${label}: ${n} in ${figures.seconds} s (${figures.perSecond}/s), p50 ${latency.p50Ms} ms p99 ${latency.p99Ms} ms; per op: ${figures.redisCallsPerOp} Redis calls, Redis ${figures.redisCpuUsPerOp} µs, gateway ${figures.gatewayCpuUsPerOp} µs, hosts ${figures.workerCpuUsPerOp} µs CPU; ${JSON.stringify(outcomes)}`);
    return figures;
  };

  const created: { id: string; job: string; node: string; ms: number }[] = [];
  const create = (job: string) => async (): Promise<string> => {
    const t = performance.now();
    const r = await client('POST', '/v1/sandboxes', { resources: SANDBOX, job });
    if (r.status === 201 && r.body.state === 'running') {
      created.push({ id: r.body.id, job, node: r.body.node, ms: performance.now() - t });
      return 'running';
    }
    return r.body?.error?.code ?? `http_${r.status}`;
  };

  // --- Background (once the hosts' start-up has settled), fill, background again
  await settled();
  const idleEmpty = await background('no sandboxes');
  const memoryBefore = await redisMemoryBytes();
  const fill = await phase(`fill (${LIVE} creates, ${CONCURRENCY} at once)`, LIVE, CONCURRENCY, idleEmpty, create('fill'));
  const memoryAfterFill = await redisMemoryBytes();
  const liveAfterFill = created.length;
  const idleFull = await background(`${liveAfterFill} live sandboxes`);

  // --- Burst: one job asks for BURST sandboxes at once
  const loadsBefore = await loads();
  const refusalsBefore = await refusalsSoFar();
  client = clientOf(BURST);
  const burst = await phase(`burst (${BURST} creates of one job at once)`, BURST, BURST, idleFull, create('burst-job'));
  const refusals = (await refusalsSoFar()) - refusalsBefore;
  const loadsAfter = await loads();
  // The real hosts' heartbeats, once they have counted the burst's last creates.
  await new Promise((r) => setTimeout(r, 2 * config.node.heartbeatMs));
  const realHeld = await realHostLoads();
  const realAcknowledged = (id: string) => created.filter((c) => c.node === id);
  const burstLoads = [...loadsAfter].map(([node, held]) => held.length - (loadsBefore.get(node)?.length ?? 0));
  const totalLoads = [...loadsAfter.values()].map((held) => held.length);
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);
  const burstRunning = created.filter((c) => c.job === 'burst-job').length;
  // Each sandbox on one host at most; every acknowledged one still on its host (a host declared lost would drop them).
  const hostsOf = new Map<string, number>();
  for (const held of loadsAfter.values()) for (const id of held) hostsOf.set(id, (hostsOf.get(id) ?? 0) + 1);
  const acknowledged = new Set(created.filter((c) => !realHostIds.includes(c.node)).map((c) => c.id));
  const placement = {
    hosts: loadsAfter.size,
    admissionLimit: maxSandboxes,
    /** The burst's share per host (evens out what the fill left uneven, so wider than the total's). */
    burstMaxOverMean: round(Math.max(...burstLoads) / mean(burstLoads), 2),
    burstMinOverMean: round(Math.min(...burstLoads) / mean(burstLoads), 2),
    totalMaxOverMean: round(Math.max(...totalLoads) / mean(totalLoads), 2),
    maxHostLoad: Math.max(...totalLoads),
    /** Creates a host handed back (each one placed again elsewhere, or failed after the limit). */
    refusals,
    onTwoHosts: [...hostsOf.values()].filter((n) => n > 1).length,
    acknowledgedNotHeld: [...acknowledged].filter((id) => !hostsOf.has(id)).length,
    heldNotAcknowledged: [...hostsOf.keys()].filter((id) => !acknowledged.has(id)).length,
    /** Each real host: what its heartbeat says it holds, what the creates placed there were answered, and those creates' latency. */
    realHosts: realHostIds.map((id) => ({ node: id, admissionLimit: REAL_HOST_SANDBOXES, held: realHeld.get(id), acknowledged: realAcknowledged(id).length, createLatency: summarize(realAcknowledged(id).map((c) => c.ms)) })),
  };
  const burstChecks = {
    everyOneRunningOrCoded: Object.keys(burst.outcomes).every((o) => o === 'running' || o === 'no_capacity' || o === 'admission_exhausted'),
    noneTwice: new Set(created.map((c) => c.id)).size === created.length && placement.onTwoHosts === 0,
    noHostPastLimit: placement.maxHostLoad <= maxSandboxes && placement.realHosts.every((h) => h.acknowledged <= REAL_HOST_SANDBOXES),
    realHostsHoldWhatTheyAcknowledged: placement.realHosts.every((h) => h.held === h.acknowledged),
    // Placement balances each host's whole load (what it held before the burst counts), so the check is on that.
    maxLoadWithin1_25xMean: placement.totalMaxOverMean <= 1.25,
  };
  log(`placement under the burst: ${JSON.stringify(placement)}; checks ${JSON.stringify(burstChecks)}`);

  // --- Steady execs over the live sandboxes
  const live = created.map((c) => c.id);
  client = clientOf(CONCURRENCY);
  const exec = await phase(`execs (${EXECS}, ${CONCURRENCY} at once, over ${live.length} sandboxes)`, EXECS, CONCURRENCY, idleFull, async (i) => {
    const r = await client('POST', `/v1/sandboxes/${live[i % live.length]}/exec`, { argv: ['echo', String(i)] });
    if (r.status === 200 && r.body.stdout === `${i}\n`) return 'ok';
    return r.body?.error?.code ?? `http_${r.status}`;
  });

  // Charts: the latency distributions, and each host's load after the burst (how evenly placement spread it).
  const charts = {
    latency: writeCdfChart(path.join(CHARTS_DIR, 'scale-latency.svg'), `bench:scale: ${HOSTS} hollow hosts, ${created.length} live sandboxes`, [...samplesOf].map(([label, samplesMs]) => ({ label, samplesMs }))),
    placement: writeSvg(
      path.join(CHARTS_DIR, 'scale-placement.svg'),
      lineChartsSvg(`Each hollow host's sandboxes after the burst, hosts sorted (admission limit ${maxSandboxes})`, 'hosts, least to most loaded', [
        { title: 'whole load', yLabel: 'sandboxes', series: [{ label: 'held', points: [...totalLoads].sort((a, b) => a - b).map((y, x) => ({ x, y })) }] },
        { title: "the burst's share", yLabel: 'sandboxes', series: [{ label: 'created by the burst', points: [...burstLoads].sort((a, b) => a - b).map((y, x) => ({ x, y })) }] },
      ]),
    ),
  };
  log(`charts: ${charts.latency} ${charts.placement}`);

  const perCore = (us: number) => (us > 0 ? Math.round(1e6 / us) : null);
  const result = {
    bench: 'scale',
    redis: CLUSTER ? 'cluster-3x2' : 'single',
    hosts: HOSTS,
    realHosts: REAL_HOSTS,
    gateways: GATEWAYS,
    liveSandboxes: created.length,
    background: { noSandboxes: roundAll(idleEmpty), withLive: roundAll(idleFull) },
    creates: fill,
    burst: { ...burst, placement, checks: burstChecks, running: burstRunning },
    execs: exec,
    createsPerSecondPerRedisCore: perCore(fill.redisCpuUsPerOp),
    createsPerSecondPerGatewayCore: perCore(fill.gatewayCpuUsPerOp),
    createsPerSecondPerHostsCore: perCore(fill.workerCpuUsPerOp),
    execsPerSecondPerRedisCore: perCore(exec.redisCpuUsPerOp),
    execsPerSecondPerGatewayCore: perCore(exec.gatewayCpuUsPerOp),
    /** Measured over the Kubernetes SLO (<= 1 meets it). */
    slo: {
      createP99OverPodStartup: round(Math.max(fill.latency.p99Ms, burst.latency.p99Ms) / SLO.podStartupP99Ms, 3),
      execP99OverApiCall: round(exec.latency.p99Ms / SLO.apiCallP99Ms, 3),
    },
    redisMemoryBytesPerLiveSandbox: Math.round((memoryAfterFill - memoryBefore) / Math.max(1, liveAfterFill)),
    charts,
  };
  await cleanup();
  console.log(JSON.stringify(result));
} catch (err) {
  await cleanup().catch(() => undefined);
  throw err;
}

function round(x: number, digits: number): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

function roundAll(rate: Record<Counted, number>): Record<Counted, number> {
  return Object.fromEntries(COUNTED.map((k) => [k, round(rate[k], 3)])) as Record<Counted, number>;
}
