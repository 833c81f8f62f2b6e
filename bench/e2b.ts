/**
 * bench:e2b — `commands.run('true')` through the official E2B SDK (e2b 2.51, its Connect
 * stream to envd at the gateway) beside rollbox's own TypeScript client's exec of the same
 * command in the same sandbox, interleaved one by one in the same run, so both see the
 * same host. The native client is the floor; the target is at most 1.5x. Also the SDK's
 * create beside the native create. Prints progress on stderr, writes a CDF chart to
 * bench/out/, ends with one JSON line.
 */
import path from 'node:path';
import { Redis } from 'ioredis';
import { Sandbox } from 'e2b';
import { RollboxClient } from '../src/client/index.ts';
import { E2bKeyStore } from '../src/iam/index.ts';
import { progressBar, summarize, writeCdfChart } from '../src/report/index.ts';
import { startTestCluster } from '../test/support/cluster.ts';
import { timed } from './support/runc-floor.ts';

const RUNS = Number(process.env.BENCH_RUNS ?? 300);
const CREATES = Number(process.env.BENCH_CREATES ?? 10);

const cluster = await startTestCluster({ workers: [{ nodeId: 'bench-node' }], env: { ROLLBOX_HEARTBEAT_MS: '1000', ROLLBOX_NODE_LOST_AFTER_MS: '5000' } });
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));
const redis = new Redis(cluster.redisUrl);
try {
  const scopes = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete'] as const;
  const native = new RollboxClient({ baseUrl: cluster.url, token: await cluster.token('bench', [...scopes]) });
  const { key } = await new E2bKeyStore(redis).issue({ tenant: 'bench', scopes });
  Object.assign(process.env, { E2B_API_URL: cluster.url, E2B_SANDBOX_URL: cluster.url, E2B_API_KEY: key });

  const createSamples = { e2b: [] as number[], native: [] as number[] };
  const created: string[] = [];
  const createBar = progressBar('creates (SDK, native)', { total: CREATES });
  for (let i = 0; i < CREATES; i++) {
    createSamples.e2b.push(await timed(async () => created.push((await Sandbox.create({ timeoutMs: 600_000 })).sandboxId)));
    createSamples.native.push(await timed(async () => created.push((await native.createSandbox({ ttlSeconds: 600 })).id)));
    createBar.tick();
  }
  createBar.done();

  const sbx = await Sandbox.create({ timeoutMs: 600_000 });
  created.push(sbx.sandboxId);
  const viaSdk = async () => {
    const r = await sbx.commands.run('true');
    if (r.exitCode !== 0) throw new Error(`exit ${r.exitCode}`);
  };
  const viaNative = async () => {
    const r = await native.exec(sbx.sandboxId, { cmd: 'true' });
    if (r.exitCode !== 0) throw new Error(`exit ${r.exitCode}`);
  };
  /** Context, not the floor: the native client's streaming exec (SSE), the path an E2B command takes inside rollbox. */
  const viaNativeStream = async () => {
    for await (const ev of native.streamExec(sbx.sandboxId, { cmd: 'true' })) if (ev.type === 'exit' && ev.result.exitCode !== 0) throw new Error(`exit ${ev.result.exitCode}`);
  };
  for (let i = 0; i < 20; i++) await Promise.all([viaSdk(), viaNative(), viaNativeStream()]);
  const e2b: number[] = [];
  const floor: number[] = [];
  const nativeStream: number[] = [];
  const bar = progressBar("commands.run('true'), SDK then native", { total: RUNS });
  for (let i = 0; i < RUNS; i++) {
    e2b.push(await timed(viaSdk));
    floor.push(await timed(viaNative));
    nativeStream.push(await timed(viaNativeStream));
    bar.tick();
  }
  bar.done();
  await Promise.all(created.map((id) => native.deleteSandbox(id)));

  const s = summarize(e2b);
  const f = summarize(floor);
  const cs = summarize(createSamples.e2b);
  const cf = summarize(createSamples.native);
  const chart = writeCdfChart(path.resolve(import.meta.dirname, 'out', 'e2b-latency.svg'), "commands.run('true') round trip", [
    { label: 'E2B SDK commands.run (Connect stream)', samplesMs: e2b },
    { label: 'rollbox TS client exec (floor)', samplesMs: floor },
    { label: 'rollbox TS client streaming exec (SSE)', samplesMs: nativeStream },
  ]);
  process.stderr.write(`chart: ${chart}\n`);
  const ratio = (a: number, b: number) => Math.round((a / b) * 100) / 100;
  console.log(
    JSON.stringify({
      bench: 'e2b',
      p50Ms: s.p50Ms,
      p99Ms: s.p99Ms,
      floorP50Ms: f.p50Ms,
      floorP99Ms: f.p99Ms,
      ratioP50: ratio(s.p50Ms, f.p50Ms),
      ratioP99: ratio(s.p99Ms, f.p99Ms),
      nativeStreamP50Ms: summarize(nativeStream).p50Ms,
      createP50Ms: cs.p50Ms,
      nativeCreateP50Ms: cf.p50Ms,
      createRatioP50: ratio(cs.p50Ms, cf.p50Ms),
      n: s.n,
      sdk: 'e2b@2.51.0',
      targets: { ratioP50: 1.5 },
      chart,
    }),
  );
} finally {
  redis.disconnect();
  await cluster.stop();
}
