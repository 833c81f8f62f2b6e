/**
 * bench:e2b — `commands.run('true')` through the official E2B SDK (e2b 2.51, its Connect
 * stream to envd at the gateway) beside rollbox's own TypeScript client's exec of the same
 * command in the same sandbox, interleaved one by one in the same run, so both see the
 * same host, from a client process of their own (bench/support/exec-arm.ts), as a
 * harness is. The native client is the floor; the target is at most 1.5x. Also the SDK's
 * create beside the native create, and a pty arm: keystroke to echo on a terminal through
 * the SDK's `pty` (sendInput, then its Connect stream) and through rollbox's own pty API
 * (stdin, then the command's event stream), each as a ratio to the exec floor of the same
 * run; and a port arm (bench/support/port-arm.ts, a client process of its own, as callers
 * are): a GET through `getHost(port)` to busybox httpd in a sandbox, beside the same GET
 * straight into the sandbox's network namespace from the host (the floor). Prints progress
 * on stderr, writes CDF charts to bench/out/, ends with one JSON line.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { Redis } from 'ioredis';
import { Sandbox } from 'e2b';
import type { NodeHeartbeat } from '../src/api/index.ts';
import { RollboxClient } from '../src/client/index.ts';
import { runTool } from '../src/proc/index.ts';
import { E2bKeyStore } from '../src/iam/index.ts';
import { progressBar, summarize, writeCdfChart } from '../src/report/index.ts';
import { api, startTestCluster } from '../test/support/cluster.ts';
import { runExecArm } from './support/exec-arm.ts';
import { runPortArm, type PortArmSamples } from './support/port-arm.ts';
import { sandboxPaths, timed } from './support/runc-floor.ts';

const RUNS = Number(process.env.BENCH_RUNS ?? 300);
const CREATES = Number(process.env.BENCH_CREATES ?? 10);
const PORT_RUNS = Number(process.env.BENCH_PORT_RUNS ?? RUNS);
const HTTPD_PORT = 8080;
const PAGE = 'hello from a port\n';

async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

// E2B's `base` is busybox here: the bench times the RPC path, not a first build of the base template.
const cluster = await startTestCluster({ workers: [{ nodeId: 'bench-node' }], env: { ROLLBOX_HEARTBEAT_MS: '1000', ROLLBOX_NODE_LOST_AFTER_MS: '5000', ROLLBOX_E2B_BASE_TEMPLATE: 'off' } });
process.once('SIGINT', () => void cluster.stop().finally(() => process.exit(130)));
const redis = new Redis(cluster.redisUrl);
try {
  const scopes = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete'] as const;
  const nativeToken = await cluster.token('bench', [...scopes]);
  const native = new RollboxClient({ baseUrl: cluster.url, token: nativeToken });
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
  // The command arm, from a client process of its own (bench/support/exec-arm.ts).
  const { e2b, floor, nativeStream } = await runExecArm({ runs: RUNS, gatewayUrl: cluster.url, e2bKey: key, token: nativeToken, sandboxId: sbx.sandboxId });
  /** The pty arm's floor: rollbox's own exec, from this process as its terminals are. */
  const viaNative = async () => {
    const r = await native.exec(sbx.sandboxId, { cmd: 'true' });
    if (r.exitCode !== 0) throw new Error(`exit ${r.exitCode}`);
  };

  // Keystroke to echo: one key typed at the shell's prompt, timed until the terminal shows
  // it. Both terminals in the same sandbox.
  const PTY_RUNS = Number(process.env.BENCH_PTY_RUNS ?? Math.min(RUNS, 150));
  const echoTimer = () => {
    let seen = '';
    let waiting: { key: string; from: number; resolve: () => void } | undefined;
    return {
      output(text: string) {
        seen += text;
        if (waiting && seen.indexOf(waiting.key, waiting.from) >= 0) waiting.resolve();
      },
      async type(key: string, send: (key: string) => Promise<unknown>) {
        const from = seen.length;
        const echoed = new Promise<void>((resolve) => (waiting = { key, from, resolve }));
        await send(key);
        await echoed;
      },
      async ready(what: string) {
        const deadline = Date.now() + 15_000;
        while (!seen.includes(what)) {
          if (Date.now() > deadline) throw new Error(`no ${JSON.stringify(what)} on the terminal: ${JSON.stringify(seen.slice(-200))}`);
          await new Promise((r) => setTimeout(r, 20));
        }
      },
    };
  };
  const sdkTerm = echoTimer();
  const decoder = new TextDecoder();
  const terminal = await sbx.pty.create({ cols: 80, rows: 24, envs: { PS1: 'p$ ' }, onData: (d) => sdkTerm.output(decoder.decode(d, { stream: true })) });
  const sdkKey = (key: string) => sbx.pty.sendInput(terminal.pid, new TextEncoder().encode(key));
  const nativeTerm = echoTimer();
  const nativePty = await native.createPty(sbx.sandboxId, { cols: 80, rows: 24, env: { PS1: 'p$ ' } });
  const following = (async () => {
    for await (const ev of native.followCommand(sbx.sandboxId, nativePty.commandId)) if (ev.type === 'pty') nativeTerm.output(ev.data);
  })();
  const nativeKey = (key: string) => native.writeStdin(sbx.sandboxId, nativePty.commandId, key);
  await sdkTerm.ready('p$ ');
  await nativeTerm.ready('p$ ');
  const ptySdk: number[] = [];
  const ptyNative: number[] = [];
  const ptyFloor: number[] = [];
  const ptyBar = progressBar('pty keystroke to echo, SDK then native', { total: PTY_RUNS });
  for (let i = 0; i < PTY_RUNS; i++) {
    // Digits: the prompt has none, so the echo is the key itself.
    const key = String(i % 10);
    ptySdk.push(await timed(() => sdkTerm.type(key, sdkKey)));
    ptyNative.push(await timed(() => nativeTerm.type(key, nativeKey)));
    ptyFloor.push(await timed(viaNative));
    if (i % 40 === 39) {
      // ^U clears the typed line (untimed), so it never wraps.
      await Promise.all([sdkKey('\x15'), nativeKey('\x15')]);
      await new Promise((r) => setTimeout(r, 50));
    }
    ptyBar.tick();
  }
  ptyBar.done();
  await sbx.pty.kill(terminal.pid);
  await native.signalCommand(sbx.sandboxId, nativePty.commandId, 'KILL');
  await following;

  // The port arm: the same busybox httpd page in a busybox sandbox (through getHost, and
  // straight into its namespace) and on the host.
  const web = await Sandbox.create('busybox', { timeoutMs: 600_000 });
  created.push(web.sandboxId);
  await web.commands.run(`mkdir -p /www && printf '${PAGE.replace('\n', '\\n')}' > /www/index.html && httpd -p ${HTTPD_PORT} -h /www`);
  const hostWww = await fs.mkdtemp(path.join(cluster.rootDir, 'www-'));
  await fs.writeFile(path.join(hostWww, 'index.html'), PAGE);
  const hostPort = await freePort();
  const hostHttpd = spawn('busybox', ['httpd', '-f', '-p', `127.0.0.1:${hostPort}`, '-h', hostWww], { stdio: 'ignore' });
  const { runcRoot, containerId } = sandboxPaths(path.join(cluster.rootDir, 'bench-node', 'worker'), web.sandboxId);
  const state = await runTool('runc', ['--root', runcRoot, 'state', containerId], { output: 'collect' });
  const nodes = (await api<{ nodes: NodeHeartbeat[] }>(cluster, await cluster.token('ops', ['admin']), 'GET', '/v1/nodes')).body.nodes;
  let portSamples: PortArmSamples;
  try {
    portSamples = await runPortArm({
      runs: PORT_RUNS,
      page: PAGE,
      gatewayPort: Number(new URL(cluster.url).port),
      getHost: web.getHost(HTTPD_PORT),
      trafficToken: web.trafficAccessToken!,
      relay: nodes.find((n) => n.nodeId === 'bench-node')!.portRelay!,
      redisUrl: cluster.redisUrl,
      sandboxId: web.sandboxId,
      port: HTTPD_PORT,
      initPid: (JSON.parse(state.stdout) as { pid: number }).pid,
      hostPort,
    });
  } finally {
    hostHttpd.kill('SIGKILL');
  }
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
  const portChart = writeCdfChart(path.resolve(import.meta.dirname, 'out', 'e2b-port-latency.svg'), 'GET of a page from busybox httpd, new connection each', [
    { label: 'through getHost (gateway, port relay, sandbox netns)', samplesMs: portSamples.getHost },
    { label: "the worker's port relay alone (ticket minted by the bench)", samplesMs: portSamples.relayOnly },
    { label: 'straight into the sandbox namespace (rollbox-portfwd, floor)', samplesMs: portSamples.floor },
    { label: "the host's busybox httpd on its loopback (context)", samplesMs: portSamples.hostLoopback },
  ]);
  process.stderr.write(`charts: ${chart} ${portChart}\n`);
  const gs = summarize(portSamples.getHost);
  const gf = summarize(portSamples.floor);
  const ps = summarize(ptySdk);
  const pn = summarize(ptyNative);
  const pf = summarize(ptyFloor);
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
      pty: { sdkEchoP50Ms: ps.p50Ms, nativeEchoP50Ms: pn.p50Ms, floorP50Ms: pf.p50Ms, sdkRatioP50: ratio(ps.p50Ms, pf.p50Ms), nativeRatioP50: ratio(pn.p50Ms, pf.p50Ms), sdkEchoP99Ms: ps.p99Ms, n: ps.n },
      port: { p50Ms: gs.p50Ms, p99Ms: gs.p99Ms, floorP50Ms: gf.p50Ms, floorP99Ms: gf.p99Ms, ratioP50: ratio(gs.p50Ms, gf.p50Ms), ratioP99: ratio(gs.p99Ms, gf.p99Ms), relayOnlyP50Ms: summarize(portSamples.relayOnly).p50Ms, hostLoopbackP50Ms: summarize(portSamples.hostLoopback).p50Ms, n: gs.n },
      n: s.n,
      sdk: 'e2b@2.51.0',
      targets: { ratioP50: 1.5, port: { ratioP50: 1.5 } },
      chart,
      portChart,
    }),
  );
} finally {
  redis.disconnect();
  await cluster.stop();
}
