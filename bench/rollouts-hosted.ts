/**
 * bench:rollouts-hosted — hosted rollouts (issue 39) against the same agent loop run by the
 * trainer, in the same run. One agent (bench/support/agents/loop-agent.ts: the official
 * `openai` SDK, its tool calls through the rollbox client) drives ROLLOUTS rollouts of TURNS
 * model calls each, CONCURRENCY at once, against a scripted upstream on loopback that answers
 * every call after MODEL_MS (200 ms):
 * - trainer arm: the trainer creates the task sandbox (HTTP API) and runs the agent itself,
 *   on the host (what `bench:rollouts` drives, plus the model), every other rollout calling
 *   the upstream directly, the others through the gateway (a rollout key of their own);
 * - hosted arm: the same agent in an agent sandbox beside its task sandbox, submitted as a
 *   batch of rollouts, its model calls through the worker host's relay and the gateway.
 * The arms run in halves, trainer-hosted-hosted-trainer, after a warm-up of each, so both see
 * the same machine. Reported: each model call's time as its agent saw it (p50, p99; the
 * gateway's added time: the trainer-run agents' calls through it less their direct calls;
 * hosting's: the hosted agents' less the direct calls), rollouts per second of each arm and
 * their ratio, and then an outage: a hosted batch whose upstream is stopped for
 * OUTAGE_SECONDS (60) mid-run, and the time from its return until every rollout that was
 * running has a model call up again. Progress on stderr, one JSON line last.
 *
 * Flags: --rollouts 64 --turns 20 --concurrency 8 --model-ms 200 --outage-seconds 60
 * --outage-rollouts 16 (a quick run: --rollouts 8 --turns 5 --concurrency 4 --outage-seconds 3
 * --outage-rollouts 4). Any rollout that does not end `succeeded` with exactly TURNS recorded
 * model calls (the outage's held calls included) fails the run.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { Redis } from 'ioredis';
import type { Batch, BatchResultLine, Trajectory } from '../src/api/index.ts';
import { RolloutKeyStore } from '../src/iam/index.ts';
import { progressBar, summarize, type ProgressBar } from '../src/report/index.ts';
import { agentLayerTar, bundleAgent } from '../test/support/agent-layer.ts';
import { api, startTestCluster, waitFor } from '../test/support/cluster.ts';
import { ScriptedUpstream, type ScriptTurn } from '../test/support/model-upstream.ts';
import { jsonClient } from './support/http.ts';

const { values: flags } = parseArgs({
  options: {
    rollouts: { type: 'string', default: '64' },
    turns: { type: 'string', default: '20' },
    concurrency: { type: 'string', default: '8' },
    'model-ms': { type: 'string', default: '200' },
    'outage-seconds': { type: 'string', default: '60' },
    'outage-rollouts': { type: 'string', default: '16' },
  },
});
const ROLLOUTS = Number(flags.rollouts);
const TURNS = Number(flags.turns);
const CONCURRENCY = Number(flags.concurrency);
const MODEL_MS = Number(flags['model-ms']);
const OUTAGE_MS = Number(flags['outage-seconds']) * 1000;
const OUTAGE_ROLLOUTS = Number(flags['outage-rollouts']);
const WARMUP_ROLLOUTS = 2;
const AGENTS_DIR = path.join(import.meta.dirname, 'support', 'agents');
/** The task sandbox of both arms (as bench:rollouts makes it). */
const TASK_RESOURCES = { memoryMiB: 128, cpuMillis: 500 };
/** The agent sandbox's: the CPU a trainer-run agent has (the host's two cores), so the arms differ in where the loop runs only. */
const AGENT_RESOURCES = { memoryMiB: 256, cpuMillis: 2000 };
const JOB = 'bench-hosted';

/** Every turn but the last runs a command that builds on the one before; the last answers. */
const SCRIPT: ScriptTurn[] = Array.from({ length: TURNS }, (_, i) =>
  i < TURNS - 1 ? { text: `Step ${i + 1}.`, toolCalls: [{ name: 'bash', arguments: { cmd: `cd /root && echo "step ${i + 1}" >> work.log && wc -l < work.log` } }] } : { text: 'Done.' },
);

// A deployment's heartbeat and silences (the test defaults declare a host lost after 1.5 s,
// which a loaded 2-core machine reaches mid-run and which fails that host's rollouts).
const cluster = await startTestCluster({ env: { ROLLBOX_HEARTBEAT_MS: '1000', ROLLBOX_NODE_STALE_AFTER_MS: '5000', ROLLBOX_NODE_LOST_AFTER_MS: '30000' } });
const redis = new Redis(cluster.redisUrl);
let ending = false;
const upstream = await ScriptedUpstream.start({ script: SCRIPT });
upstream.delayMs = MODEL_MS;
const scratch = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-bench-hosted-'));
process.once('SIGINT', () => void Promise.all([upstream.stop(), cluster.stop(), fs.rm(scratch, { recursive: true, force: true })]).finally(() => process.exit(130)));
try {
  // The gateway in its own process, as deployed (this process holds the trainer and the
  // upstream): every request of the bench and of the agents goes to it; the worker hosts
  // relay the agent sandboxes to it.
  const gateway = await cluster.spawnGateway({ name: 'bench-gw' });
  gateway.child.once('exit', (code, signal) => void (ending || process.stderr.write(`\nthe gateway process exited (${code ?? signal}) mid-run\n`)));
  for (const nodeId of ['bench-a', 'bench-b']) await cluster.spawnWorker({ nodeId, env: { ROLLBOX_SANDBOX_GATEWAY_URL: gateway.url } });
  const trainer = await cluster.token('bench', ['sandbox:create', 'sandbox:delete', 'sandbox:exec', 'rollout:submit', 'batch:submit', 'layer:write', 'admin']);
  await waitFor('both worker hosts', async () => (await api(cluster, trainer, 'GET', '/v1/nodes')).body.nodes?.length === 2, 90_000);
  const call = jsonClient(gateway.url, trainer);
  const keys = new RolloutKeyStore(redis);
  const bound = await call('PUT', `/v1/jobs/${JOB}/model`, { upstreams: [{ baseUrl: upstream.url }], headers: { authorization: 'Bearer sk-bench-upstream' } });
  if (bound.status !== 200) throw new Error(`binding failed: ${bound.status} ${JSON.stringify(bound.body)}`);
  process.stderr.write('bundling the agent...\n');
  const layer = await api(cluster, trainer, 'POST', '/v1/layers?name=bench-agent', new Uint8Array(await agentLayerTar(['loop-agent'], AGENTS_DIR)), { 'content-type': 'application/x-tar' });
  if (layer.status !== 201) throw new Error(`agent layer refused: ${layer.status} ${JSON.stringify(layer.body)}`);
  const hostAgent = path.join(scratch, 'loop-agent.mjs');
  await bundleAgent(path.join(AGENTS_DIR, 'loop-agent.ts'), hostAgent);

  /** Each agent process's run, start to exit (where a rollout's time goes beside its sandboxes' creates). */
  const agentMs = { trainer: [] as number[], hosted: [] as number[] };
  /** What the agents said: each model call's time as the agent saw it. */
  const agentTimes = (stdout: string, what: string): number[] => {
    const last = stdout.trim().split('\n').at(-1) ?? '';
    const times = (JSON.parse(last) as { modelMs: number[] }).modelMs;
    if (times.length !== TURNS) throw new Error(`${what} made ${times.length} model calls, the script has ${TURNS}`);
    return times;
  };
  /** The agent's task names its rollout: the upstream tells rollouts apart by it. */
  const taskOf = (tag: string) => `rollout ${tag}: keep a log of the steps`;
  const rolloutOfRequest = (body: Record<string, any>) => /^rollout (\S+):/.exec(String(body.messages?.[0]?.content ?? ''))?.[1];

  /**
   * The trainer arm's rollout: its task sandbox, the agent run here, then the sandbox deleted.
   * Its model calls go to the upstream directly, or (`viaGateway`, every other rollout) through
   * the gateway under a rollout key of its own: the same agent process on the same host, so
   * the difference is the gateway's alone (the hosted arm adds the sandbox's network and the
   * worker host's relay, and runs the agent in a cgroup).
   */
  const trainerRollout = async (tag: string, viaGateway: boolean): Promise<number[]> => {
    const created = await call('POST', '/v1/sandboxes', { resources: TASK_RESOURCES, labels: { rollout: tag } });
    if (created.status !== 201) throw new Error(`create failed: ${created.status} ${JSON.stringify(created.body)}`);
    const sandboxId = created.body.id as string;
    try {
      const rolloutId = `trainer-${tag}`;
      const model = viaGateway
        ? { OPENAI_BASE_URL: `${gateway.url}/v1/rollouts/${rolloutId}/model/v1`, OPENAI_API_KEY: await keys.issue({ tenant: 'bench', rolloutId, job: JOB, ttlSeconds: 3600 }) }
        : { OPENAI_BASE_URL: upstream.url, OPENAI_API_KEY: 'sk-bench-upstream' };
      const env = { PATH: process.env.PATH ?? '', ...model, ROLLBOX_URL: gateway.url, ROLLBOX_API_KEY: trainer, ROLLBOX_SANDBOX_ID: sandboxId, AGENT_TASK: taskOf(tag) };
      const started = performance.now();
      const run = await runNode(hostAgent, env);
      agentMs.trainer.push(performance.now() - started);
      if (run.code !== 0) throw new Error(`trainer-run agent ${tag} exited ${run.code}: ${run.stderr.slice(-2000)}`);
      return agentTimes(run.stdout, `trainer-run agent ${tag}`);
    } finally {
      await call('DELETE', `/v1/sandboxes/${sandboxId}`);
    }
  };
  /** Model call times of the trainer arm: direct to the upstream, and through the gateway. */
  const trainerArm = async (tags: string[]): Promise<{ direct: number[]; gateway: number[] }> => {
    const times = { direct: [] as number[], gateway: [] as number[] };
    let next = 0;
    await Promise.all(
      Array.from({ length: Math.min(CONCURRENCY, tags.length) }, async () => {
        while (next < tags.length) {
          const k = next++;
          times[k % 2 ? 'gateway' : 'direct'].push(...(await trainerRollout(tags[k]!, k % 2 === 1)));
        }
      }),
    );
    return times;
  };

  const hostedTask = (tag: string) => ({
    customId: tag,
    resources: TASK_RESOURCES,
    agent: { image: { base: 'busybox', layers: [layer.body.digest] }, argv: ['/usr/bin/node', '/agent/loop-agent.mjs'], env: { AGENT_TASK: taskOf(tag) }, resources: AGENT_RESOURCES, timeoutMs: 900_000 },
    model: { job: JOB },
  });
  const submitHosted = async (tags: string[]): Promise<Batch> => {
    // Latency class, as the trainer's own sandboxes: the arms differ in where the loop runs only.
    const r = await call('POST', '/v1/batches', { tasks: tags.map(hostedTask), maxConcurrency: CONCURRENCY, maxAttempts: 1, class: 'latency' });
    if (r.status !== 201) throw new Error(`batch refused: ${r.status} ${JSON.stringify(r.body)}`);
    return r.body as Batch;
  };
  /** Every result line of a batch (long-polled), once all its tasks ended. */
  const resultsOf = async (batch: Batch, count: number): Promise<BatchResultLine[]> => {
    const lines: BatchResultLine[] = [];
    let after = '';
    for (const deadline = Date.now() + 30 * 60_000; lines.length < count; ) {
      if (Date.now() > deadline) throw new Error(`batch ${batch.id}: ${lines.length} of ${count} results in 30 minutes`);
      const r = await call('GET', `/v1/batches/${batch.id}/results?waitSeconds=30${after ? `&after=${after}` : ''}`);
      if (r.status !== 200) throw new Error(`results of ${batch.id}: ${r.status}`);
      const text = typeof r.body === 'string' ? r.body : JSON.stringify(r.body);
      for (const row of text.split('\n')) if (row.trim()) lines.push(JSON.parse(row) as BatchResultLine);
      after = String(r.headers['x-rollbox-cursor'] ?? after);
    }
    return lines;
  };
  const hostedTimes = (lines: BatchResultLine[]): number[] =>
    lines.flatMap((line) => {
      if (line.status !== 'succeeded' || line.rollout?.modelCalls !== TURNS) throw new Error(`hosted rollout ${line.customId} ended ${JSON.stringify(line).slice(0, 2000)}`);
      agentMs.hosted.push(line.agent!.durationMs);
      return agentTimes(line.agent!.stdout, `hosted agent ${line.customId}`);
    });
  /** Of each recorded call, the gateway's own part: from its arrival to its record, less the upstream's time (and any hold). */
  const gatewayOwnMs: number[] = [];
  const hostedArm = async (tags: string[], measured = true): Promise<number[]> => {
    const batch = await submitHosted(tags);
    const lines = await resultsOf(batch, tags.length);
    if (measured) {
      for (const line of lines) {
        const trajectory = await call('GET', `/v1/rollouts/${line.rollout!.id}/trajectory`);
        for (const entry of (trajectory.body as Trajectory).entries) if (entry.kind === 'model_call') gatewayOwnMs.push(Date.parse(entry.call.endedAt) - Date.parse(entry.call.receivedAt) - entry.call.upstreamMs - entry.call.heldMs);
      }
    }
    return hostedTimes(lines);
  };

  // Progress: each rollout's turns as the upstream first sees them (a call held through the
  // outage reaches it again when it is back, and counts once).
  let bar: ProgressBar | undefined;
  const turnsSeen = new Set<string>();
  upstream.onRequest = async (r) => {
    const turn = `${rolloutOfRequest(r.body)}:${r.turn}`;
    if (turnsSeen.has(turn)) return;
    turnsSeen.add(turn);
    bar?.tick();
  };
  const tagsOf = (prefix: string, count: number) => Array.from({ length: count }, (_, k) => `${prefix}${k}`);

  process.stderr.write('warm-up (both arms)...\n');
  await Promise.all([trainerArm(tagsOf('wt', WARMUP_ROLLOUTS)), hostedArm(tagsOf('wh', WARMUP_ROLLOUTS), false)]);
  agentMs.trainer.length = agentMs.hosted.length = 0;

  const half = Math.ceil(ROLLOUTS / 2);
  const halves = [tagsOf('ta', half), tagsOf('tb', ROLLOUTS - half)];
  const hostedHalves = [tagsOf('ha', half), tagsOf('hb', ROLLOUTS - half)];
  const arms = { trainer: { wallMs: 0, rollouts: 0 }, hosted: { wallMs: 0, rollouts: 0 } };
  const callMs = { direct: [] as number[], gateway: [] as number[], hosted: [] as number[] };
  const runArm = async (arm: 'trainer' | 'hosted', tags: string[]) => {
    bar = progressBar(`${arm} arm (x${CONCURRENCY})`, { total: tags.length * TURNS });
    const started = performance.now();
    if (arm === 'hosted') callMs.hosted.push(...(await hostedArm(tags)));
    else {
      const times = await trainerArm(tags);
      callMs.direct.push(...times.direct);
      callMs.gateway.push(...times.gateway);
    }
    arms[arm].wallMs += performance.now() - started;
    arms[arm].rollouts += tags.length;
    bar.done();
  };
  await runArm('trainer', halves[0]!);
  await runArm('hosted', hostedHalves[0]!);
  await runArm('hosted', hostedHalves[1]!);
  await runArm('trainer', halves[1]!);

  const agentRunP50Seconds = { trainer: summarize(agentMs.trainer).p50Ms / 1000, hosted: summarize(agentMs.hosted).p50Ms / 1000 };

  // The outage: the upstream stopped mid-run for OUTAGE_MS, then back on the same port.
  bar = progressBar(`outage run (x${CONCURRENCY})`, { total: OUTAGE_ROLLOUTS * TURNS });
  const outageTags = tagsOf('o', OUTAGE_ROLLOUTS);
  const sinceMs = Date.now();
  const outageBatch = await submitHosted(outageTags);
  const outageRequests = () => upstream.received.filter((r) => r.atMs >= sinceMs && rolloutOfRequest(r.body)?.startsWith('o'));
  // Mid-run: the first wave (CONCURRENCY rollouts) all begun and about half their turns made.
  const waveStarted = Math.min(CONCURRENCY, OUTAGE_ROLLOUTS);
  await waitFor('the outage run halfway through its first wave', async () => new Set(outageRequests().map((r) => rolloutOfRequest(r.body))).size >= waveStarted && outageRequests().length >= (waveStarted * TURNS) / 2, 600_000);
  await upstream.stop();
  const seen = outageRequests();
  const finished = new Set(seen.filter((r) => r.turn === TURNS - 1).map((r) => rolloutOfRequest(r.body)));
  const running = [...new Set(seen.map((r) => rolloutOfRequest(r.body)!))].filter((tag) => !finished.has(tag));
  process.stderr.write(`\nupstream stopped for ${OUTAGE_MS / 1000} s with ${running.length} rollouts running...\n`);
  await new Promise((r) => setTimeout(r, OUTAGE_MS));
  await upstream.restart();
  const backAtMs = Date.now();
  const movingAgainMs = await waitFor(
    'every running rollout moving again',
    async () => {
      const firstAfter = new Map<string, number>();
      for (const r of upstream.received) {
        const tag = rolloutOfRequest(r.body);
        if (r.atMs >= backAtMs && tag && !firstAfter.has(tag)) firstAfter.set(tag, r.atMs - backAtMs);
      }
      return running.every((tag) => firstAfter.has(tag)) && running.map((tag) => firstAfter.get(tag)!);
    },
    120_000,
  );
  // Each turn of each rollout recorded once, however its held call was retried (checked there).
  hostedTimes(await resultsOf(outageBatch, OUTAGE_ROLLOUTS));
  bar.done();

  const [d, g, h] = [summarize(callMs.direct), summarize(callMs.gateway), summarize(callMs.hosted)];
  const m = summarize(movingAgainMs);
  const round = (x: number, places = 2) => Math.round(x * 10 ** places) / 10 ** places;
  const rate = (arm: { wallMs: number; rollouts: number }) => arm.rollouts / (arm.wallMs / 1000);
  console.log(
    JSON.stringify({
      bench: 'rollouts-hosted',
      rollouts: ROLLOUTS,
      turns: TURNS,
      concurrency: CONCURRENCY,
      modelMs: MODEL_MS,
      workers: 2,
      /** Time the gateway adds to a model call, as the agent sees it: the trainer-run agent's calls through the gateway less its calls to the upstream directly (the same host, interleaved rollouts). */
      addedP50Ms: round(g.p50Ms - d.p50Ms),
      addedP99Ms: round(g.p99Ms - d.p99Ms),
      /** The same for a hosted agent (in its sandbox, through the worker host's relay) against the direct calls: hosting's whole cost per call on this machine. */
      hostedAddedP50Ms: round(h.p50Ms - d.p50Ms),
      hostedAddedP99Ms: round(h.p99Ms - d.p99Ms),
      modelCallDirectP50Ms: d.p50Ms,
      modelCallDirectP99Ms: d.p99Ms,
      modelCallGatewayP50Ms: g.p50Ms,
      modelCallGatewayP99Ms: g.p99Ms,
      modelCallHostedP50Ms: h.p50Ms,
      modelCallHostedP99Ms: h.p99Ms,
      modelCalls: d.n + g.n + h.n,
      /** The gateway's own part of a call (arrival to durable record, less upstream time), from the records (ms resolution): the rest of the added time is the hops (sandbox network, worker host relay, HTTP). */
      gatewayOwnP50Ms: summarize(gatewayOwnMs).p50Ms,
      gatewayOwnP99Ms: summarize(gatewayOwnMs).p99Ms,
      hostedRolloutsPerSecond: round(rate(arms.hosted), 3),
      trainerRolloutsPerSecond: round(rate(arms.trainer), 3),
      /** Hosted throughput over the trainer's, the same agent loop, in the same run (half the trainer arm's rollouts call the model through the gateway). */
      throughputRatio: round(rate(arms.hosted) / rate(arms.trainer), 3),
      /** An agent's run, start to exit, p50 (the rest of a rollout is its sandboxes' creates and deletes, and for a hosted one its batch's scheduling). */
      agentRunP50Seconds: { trainer: round(agentRunP50Seconds.trainer), hosted: round(agentRunP50Seconds.hosted) },
      outage: {
        stoppedSeconds: OUTAGE_MS / 1000,
        rollouts: OUTAGE_ROLLOUTS,
        runningWhenStopped: running.length,
        /** From the upstream's return until each rollout running at the stop had a model call up again (max: every rollout moving). */
        movingAgainMaxMs: round(Math.max(...movingAgainMs), 0),
        movingAgainP50Ms: m.p50Ms,
      },
      loadAverage: round(os.loadavg()[0]!, 1),
      targets: { addedP50Ms: 2, throughputRatio: 0.95, movingAgainMaxMs: 2000 },
    }),
  );
} finally {
  ending = true;
  upstream.onRequest = undefined;
  redis.disconnect();
  await upstream.stop();
  await cluster.stop();
  await fs.rm(scratch, { recursive: true, force: true });
}

/** Runs a node script to its exit, with its output (a hung agent is killed after 15 minutes). */
function runNode(file: string, env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [file], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => void (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => void (stderr += d.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), 15 * 60_000);
    child.once('error', reject);
    child.once('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}
