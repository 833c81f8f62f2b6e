import type { ChildProcess } from 'node:child_process';
import { execFileSync } from 'node:child_process';
import dgram from 'node:dgram';
import fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NodeHeartbeat } from '../src/api/index.ts';
import { inHostOrder } from '../src/workers/network/gateway-reach.ts';
import { api, spawnReadyWorker, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { dnatTargetOf } from './support/gateway-dnat.ts';

// An agent sandbox's reach to the gateway (`network: {gateway: true}`, a hosted rollout's agent)
// is held by the host's kernel, not by its worker host's process: a DNAT rule to the first
// configured gateway that answers, and the gateway's name in the sandbox's /etc/hosts. So it
// goes on while the worker host is SIGKILLed and down, and moves to the next gateway when
// the first dies. And the veth's route_localnet (a gateway on loopback) opens nothing else of
// the host's loopback, even to a sandbox whose own rules are gone. Real gateway processes, a
// real worker host process, runc and nftables.
const NODE = 'node-reach';
/** Seconds, as the sandbox's `date +%s` prints them. */
const nowSeconds = () => Math.floor(Date.now() / 1000);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const ALLOWED_NAME = 'allowed.reach.test';

let cluster: TestCluster;
let token: string;
let gateways: { child: ChildProcess; url: string }[];
let worker: ChildProcess;

async function startWorker(): Promise<void> {
  // An allowlisted name (on loopback: its rules refuse it, which is enough to see it resolve).
  worker = await spawnReadyWorker(cluster, { nodeId: NODE, env: { ROLLBOX_SANDBOX_GATEWAY_URL: gateways.map((g) => g.url).join(','), ROLLBOX_NET_STATIC_HOSTS: `${ALLOWED_NAME}=127.0.0.2` } });
}

beforeAll(async () => {
  cluster = await startTestCluster({ env: { ROLLBOX_HEARTBEAT_MS: '300', ROLLBOX_NODE_LOST_AFTER_MS: '60000' } });
  gateways = await Promise.all([cluster.spawnGateway({ name: 'gw-a' }), cluster.spawnGateway({ name: 'gw-b' })]);
  await startWorker();
  token = await cluster.token('team-reach', ['sandbox:create', 'sandbox:read', 'sandbox:exec', 'sandbox:delete']);
}, 180_000);
afterAll(async () => {
  await cluster?.stop();
}, 120_000);

async function sh(id: string, cmd: string, timeoutMs = 30_000): Promise<string> {
  const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return r.body.stdout as string;
}

/** Where the host's heartbeat says its agent sandboxes reach the gateway. */
async function reachOf(): Promise<NonNullable<NodeHeartbeat['network']>['gateway']> {
  const admin = await cluster.token('ops', ['admin']);
  return (await api<{ nodes: NodeHeartbeat[] }>(cluster, admin, 'GET', '/v1/nodes')).body.nodes.find((n) => n.nodeId === NODE)?.network?.gateway;
}

/** The prober's log: `<second> ok|fail resolved|unresolved` per attempt. */
async function probes(id: string): Promise<{ at: number; ok: boolean; resolved: boolean }[]> {
  return (await sh(id, 'cat /tmp/reach.log'))
    .trim()
    .split('\n')
    .filter((line) => /^\d+ (ok|fail) (un)?resolved$/.test(line))
    .map((line) => line.split(' '))
    .map(([at, gateway, name]) => ({ at: Number(at), ok: gateway === 'ok', resolved: name === 'resolved' }));
}

describe("an agent sandbox's reach to the gateway", () => {
  /**
   * Opens a connection to the gateway from sandbox `id` and begins a request on it (a call
   * in progress); when the connection ends, the seconds it lasted go to /tmp/held-NAME.
   */
  const holdConnection = async (id: string, name: string) => {
    const hold = `mkfifo /tmp/in-${name}; (printf 'GET /healthz HTTP/1.1\\r\\n'; sleep 60) > /tmp/in-${name} & s=$(date +%s); timeout 60 nc gateway.rollbox.internal 9180 < /tmp/in-${name}; echo $(( $(date +%s) - s )) > /tmp/held-${name}`;
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd: hold, background: true, timeoutMs: 90_000 })).status).toBe(202);
    // A gateway that answers accepts it at once; one that refused would have ended it.
    await sleep(1000);
    expect(await sh(id, `cat /tmp/held-${name} 2>/dev/null || echo open`)).toBe('open\n');
  };

  it('resets the connections to a gateway whose machine stops answering (being opened, or open and silent), so the retries reach the next; a live one keeps its own', async () => {
    const created = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 }, ttlSeconds: 120, network: { gateway: true } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const id = created.body.id as string;
    const [first] = inHostOrder(gateways, NODE).map((g) => Number(new URL(g.url).port));
    // Each attempt's time, with a connect bound longer than the test: one left hanging shows.
    const loop = 'for i in $(seq 300); do s=$(date +%s); timeout 30 wget -q -O /dev/null http://gateway.rollbox.internal:9180/healthz 2>/dev/null; echo "$(( $(date +%s) - s ))"; sleep 0.2; done > /tmp/connect.log';
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd: loop, background: true, timeoutMs: 120_000 })).status).toBe(202);
    await waitFor('attempts through the first gateway', async () => Number(await sh(id, 'wc -l < /tmp/connect.log')) >= 3 && dnatTargetOf(NODE)?.port === first, 30_000);
    // A call in progress on it: a connection open, a request begun, nothing more to send for now.
    await holdConnection(id, 'first');
    // Its machine gone, as far as packets tell: nothing comes back from it, no reset either.
    // (Its answers are dropped, not what is sent to it: the connection is then tracked, as
    // one to a gateway on another machine is once it leaves this host.)
    const table = `rollbox-test-blackhole-${process.pid}`;
    execFileSync('nft', ['-f', '-'], { input: `table inet ${table} {\n chain output {\n type filter hook output priority -10; policy accept;\n tcp sport ${first} drop\n }\n}\n` });
    try {
      await waitFor('the rule moved to the second gateway', async () => dnatTargetOf(NODE)?.port !== first, 15_000);
      // The open one was reset with the move, not left silent until its client gives up (60 s here).
      await waitFor('the call open on the first gateway reset', async () => (await sh(id, 'cat /tmp/held-first 2>/dev/null')).trim() !== '', 5000);
      // One open on the second, which stays up while the host moves back to its first.
      await holdConnection(id, 'second');
      await sleep(8000);
      const seconds = (await sh(id, 'cat /tmp/connect.log')).trim().split('\n').map(Number);
      // An attempt begun in the second or two before the move was reset then, not left for its 30 s.
      expect(Math.max(...seconds), JSON.stringify(seconds)).toBeLessThan(8);
      // And the attempts went on (a hanging one would have stopped the loop: about 4 a second).
      expect(seconds.length, JSON.stringify(seconds)).toBeGreaterThanOrEqual(15);
    } finally {
      execFileSync('nft', ['delete', 'table', 'inet', table]);
    }
    // Back: the host returns to its first gateway.
    await waitFor('the rule back on the first gateway', async () => dnatTargetOf(NODE)?.port === first, 15_000);
    await sleep(1500);
    expect(await sh(id, 'cat /tmp/held-second 2>/dev/null || echo open'), 'the call open on the second gateway, which answers, is left alone').toBe('open\n');
    expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)).status).toBe(200);
  }, 120_000);

  it('holds while its worker host is down, and moves to the next gateway when the first dies; allowlisted names resolve meanwhile', async () => {
    const network = { mode: 'allowlist', allow: [{ host: ALLOWED_NAME, ports: [1] }], gateway: true };
    const created = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 }, ttlSeconds: 300, network });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const id = created.body.id as string;
    // By name, as an agent's SDK does; each attempt a new connection. And the allowlisted name
    // resolves (its connection refused by the rules) or not ("bad address").
    const loop = [
      'for i in $(seq 400); do t=$(date +%s)',
      'if timeout 2 wget -q -O /dev/null http://gateway.rollbox.internal:9180/healthz 2>/dev/null; then g=ok; else g=fail; fi',
      `case "$(timeout 2 wget -q -O /dev/null http://${ALLOWED_NAME}:1/ 2>&1)" in *"bad address"*) n=unresolved;; *) n=resolved;; esac`,
      'echo "$t $g $n"; sleep 0.2; done > /tmp/reach.log 2>&1',
    ].join('; ');
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd: loop, background: true, timeoutMs: 300_000 })).status).toBe(202);
    // This host's first gateway (its order, rotated by node id), then the other.
    const [first, second] = inHostOrder(gateways, NODE).map((g) => ({ ...g, port: Number(new URL(g.url).port) }));
    await waitFor('the prober through the first gateway', async () => (await probes(id)).filter((p) => p.ok).length >= 3, 30_000).catch(async (e: unknown) => {
      throw new Error(`${String(e)}: ${await sh(id, 'tail -3 /tmp/reach.log; cat /etc/hosts')} DNAT to ${JSON.stringify(dnatTargetOf(NODE))}`);
    });
    expect((await sh(id, 'cat /etc/hosts')).split('\n')).toEqual(expect.arrayContaining([expect.stringMatching(/^10\.\d+\.\d+\.\d+\tgateway\.rollbox\.internal$/), `127.0.0.2\t${ALLOWED_NAME}`]));

    expect(dnatTargetOf(NODE)).toEqual({ address: '127.0.0.1', port: first!.port });
    // Operators see it in the host's heartbeat.
    await waitFor('the heartbeat naming the first gateway', async () => (await reachOf())?.target === `127.0.0.1:${first!.port}`, 10_000);
    expect(await reachOf()).toMatchObject({ answering: true });

    // The first dies: within the worker's probe (1 s) and the loop's own pace, the second answers.
    first!.child.kill('SIGKILL');
    const gwDeadAt = nowSeconds();
    await sleep(5000);
    expect(dnatTargetOf(NODE)).toEqual({ address: '127.0.0.1', port: second!.port });
    expect(await reachOf()).toMatchObject({ target: `127.0.0.1:${second!.port}`, answering: true });

    // The worker host dies and stays down a while: the agent's reach is the kernel's.
    const exited = new Promise((resolve) => worker.once('exit', resolve));
    worker.kill('SIGKILL');
    await exited;
    const workerDeadAt = nowSeconds();
    await sleep(6000);
    const workerBackAt = nowSeconds();
    await startWorker();

    const log = await probes(id);
    const onSecond = log.filter((p) => p.at >= gwDeadAt + 3 && p.at < workerDeadAt);
    const withoutWorker = log.filter((p) => p.at > workerDeadAt && p.at < workerBackAt);
    expect(onSecond.length, JSON.stringify(log)).toBeGreaterThanOrEqual(3);
    expect(onSecond.every((p) => p.ok), JSON.stringify(log)).toBe(true);
    expect(withoutWorker.length, JSON.stringify(log)).toBeGreaterThanOrEqual(10);
    expect(withoutWorker.every((p) => p.ok && p.resolved), JSON.stringify(log)).toBe(true);
    expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)).status).toBe(200);
  }, 180_000);

  it("opens nothing else of the host's loopback to it, even with its own rules gone", async () => {
    const created = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 }, ttlSeconds: 120, network: { gateway: true } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const { id, node } = created.body as { id: string; node: string };
    const hostAddress = (await sh(id, "ip route | awk '/default/ {print $3}'")).trim();
    const { init_process_pid: pid } = JSON.parse(fs.readFileSync(`${cluster.rootDir}/${node}/worker/runc/rb-${id}/state.json`, 'utf8')) as { init_process_pid: number };
    // As an agent with CAP_NET_ADMIN could (it has not: the test does it from the host, in the
    // sandbox's namespace): its ruleset gone, the host's loopback routed through eth0.
    const netns = ['nsenter', `--net=/proc/${pid}/ns/net`, '--'];
    execFileSync(netns[0]!, [...netns.slice(1), 'sh', '-c', [
      'nft delete table inet rollbox',
      'echo 1 > /proc/sys/net/ipv4/conf/eth0/route_localnet',
      'ip route del local 127.0.0.1 dev lo table local',
      'ip route del local 127.0.0.0/8 dev lo table local',
      `ip route add 127.0.0.0/8 via ${hostAddress} dev eth0 onlink`,
    ].join(' && ')]);
    // The gateway's door still opens.
    const door = execFileSync(netns[0]!, [...netns.slice(1), 'busybox', 'timeout', '5', 'busybox', 'wget', '-q', '-O', '-', `http://${hostAddress}:9180/healthz`], { encoding: 'utf8' });
    expect(door).toContain('"ok":true');
    // A service on the host's loopback (UDP: it needs no answer to be reached) hears nothing from it.
    const listener = dgram.createSocket('udp4');
    const heard: string[] = [];
    listener.on('message', (m) => heard.push(String(m)));
    await new Promise<void>((resolve) => listener.bind(0, '127.0.0.1', resolve));
    try {
      const send = `const s = require('dgram').createSocket('udp4'); let n = 0; const next = () => (n++ < 5 ? s.send('injected', ${listener.address().port}, '127.0.0.1', () => setTimeout(next, 100)) : s.close()); next();`;
      execFileSync(netns[0]!, [...netns.slice(1), process.execPath, '-e', send]);
      await sleep(1000);
      expect(heard).toEqual([]);
    } finally {
      listener.close();
    }
    expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)).status).toBe(200);
  }, 120_000);
});
