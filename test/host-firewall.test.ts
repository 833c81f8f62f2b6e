import { spawn, type ChildProcess } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NodeHeartbeat, Scope } from '../src/api/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { startNetnsHost, type FirewallFixture, type NetnsHost } from './support/netns-host.ts';
import { startTargetNetns, type TargetNetns } from './support/target-netns.ts';

/**
 * Sandbox networking on hosts whose own firewall filters the forward path (Docker's rule
 * set through either iptables backend, a native nftables host firewall), and on one where
 * nothing rollbox may touch can open it. Each "host" is a network namespace of this test
 * with a worker host running inside it, so the real host's rule sets are never changed.
 */
const SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:policy', 'admin'];
const PORT_A = 7101;
const PORT_B = 7102;
const HOLD_PORT = 7103;
const LEAK_PORT = 7104;

let cluster: TestCluster;
let token: string;

beforeAll(async () => {
  cluster = await startTestCluster();
  token = await cluster.token('firewalled', SCOPES);
}, 60_000);

afterAll(async () => {
  await cluster?.stop();
}, 60_000);

interface FirewalledHost {
  host: NetnsHost;
  target: TargetNetns;
  worker: ChildProcess;
  nodeId: string;
  /** The host's rule sets before the worker started. */
  before: string;
}

/** A fake host with `fixture` in place, `ip_forward` off, a target behind it, and a worker inside. */
async function startFirewalledHost(fixture: FirewallFixture, subnet: number): Promise<FirewalledHost> {
  const host = await startNetnsHost({ subnet, redisPort: Number(new URL(cluster.redisUrl).port), fixture });
  host.setIpForward('0');
  const before = host.rulesets();
  const target = await startTargetNetns({ subnet: 80 + subnet, holdPort: HOLD_PORT, ports: [PORT_A, PORT_B, 80], metadataRoute: true, hostNetns: host.name });
  const nodeId = `node-fw-${fixture}`;
  const worker = await cluster.spawnWorker({
    nodeId,
    netns: host.name,
    destroyOnExit: true,
    env: { REDIS_URL: host.redisUrl, ROLLBOX_NET_LEASE_DIR: `${cluster.rootDir}/${nodeId}-leases`, ROLLBOX_NET_STATIC_HOSTS: `allowed.name=${target.address}` },
  });
  return { host, target, worker, nodeId, before };
}

/** A firewalled host for one describe block: started before its tests, stopped (worker first) after them. */
function firewalledHostFor(fixture: FirewallFixture, subnet: number): () => FirewalledHost {
  let fw: FirewalledHost | undefined;
  beforeAll(async () => {
    fw = await startFirewalledHost(fixture, subnet);
  }, 60_000);
  afterAll(async () => {
    if (!fw) return;
    await stopWorker(fw);
    await fw.target.stop();
    await fw.host.stop();
  }, 60_000);
  return () => fw!;
}

async function heartbeatOf(nodeId: string): Promise<NodeHeartbeat | undefined> {
  const listed = await api<{ nodes: NodeHeartbeat[] }>(cluster, token, 'GET', '/v1/nodes');
  return listed.body.nodes.find((n) => n.nodeId === nodeId && n.healthy);
}

/** Stops the worker (its sandboxes end with it) and returns the host's rule sets after. */
async function stopWorker(fw: FirewalledHost): Promise<void> {
  if (fw.worker.exitCode !== null || fw.worker.signalCode !== null) return;
  const exited = new Promise((r) => fw.worker.once('exit', r));
  fw.worker.kill('SIGTERM');
  await exited;
}

async function sh(id: string, cmd: string): Promise<{ exitCode: number; stdout: string }> {
  const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs: 30_000 });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return r.body;
}

const reaches = async (id: string, host: string, port: number) => (await sh(id, `echo | nc -w 3 ${host} ${port}`)).stdout.includes(`hello ${port}`);

const PASSING: { fixture: FirewallFixture; subnet: number; touches: RegExp[] }[] = [
  { fixture: 'docker-iptables-nft', subnet: 1, touches: [/^iptables-nft filter DOCKER-USER \(forward\)$/] },
  { fixture: 'docker-iptables-legacy', subnet: 2, touches: [/^iptables-legacy filter DOCKER-USER \(forward\)$/] },
  { fixture: 'nftables-host-firewall', subnet: 3, touches: [/^nft inet hostfw filter_in \(input\)$/, /^nft inet hostfw filter_fw \(forward\)$/, /^nft inet hostfw filter_out \(output\)$/] },
];

describe.each(PASSING)('on a host with $fixture', ({ fixture, subnet, touches }) => {
  const host = firewalledHostFor(fixture, subnet);
  let fw: FirewalledHost;
  beforeAll(() => {
    fw = host();
  });

  it('passes its network self-test, with accept rules only where the host filters', async () => {
    const heartbeat = await waitFor('the worker heartbeat', () => heartbeatOf(fw.nodeId), 30_000);
    expect(heartbeat.network?.allowlist, heartbeat.network?.detail).toBe('ok');
    expect(heartbeat.network!.firewall).toHaveLength(touches.length);
    for (const where of touches) expect(heartbeat.network!.firewall.some((f) => where.test(f)), JSON.stringify(heartbeat.network)).toBe(true);
    expect(fw.host.ipForward()).toBe('1');
  });

  it('reaches what the allowlist names and nothing else; names resolve; metadata stays blocked; a narrowed policy cuts a flow', async () => {
    const created = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 }, network: { mode: 'allowlist', allow: [{ host: 'allowed.name', ports: [PORT_A, HOLD_PORT] }, { cidr: '169.254.0.0/16' }] } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const { id } = created.body;
    expect(await reaches(id, 'allowed.name', PORT_A)).toBe(true);
    // The outside saw the host's address: masqueraded on the way out.
    expect(fw.target.connections(PORT_A).map((c) => c.from)).toEqual([fw.target.hostAddress]);
    expect(await reaches(id, fw.target.address, PORT_B)).toBe(false);
    expect(await reaches(id, fw.target.otherAddress, PORT_A)).toBe(false);
    expect(await reaches(id, '169.254.169.254', 80)).toBe(false);
    expect(fw.target.connections(80)).toEqual([]);
    expect(fw.target.connections(PORT_B)).toEqual([]);

    // The host's own addresses and a neighbour sandbox stay out of reach, even listed:
    // rollbox's accept rules in the host's firewall widen nothing.
    const neighbour = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 }, network: { mode: 'allowlist', allow: [{ cidr: `${fw.target.address}/32` }] } });
    expect(neighbour.status, JSON.stringify(neighbour.body)).toBe(201);
    const neighbourAddress = (await sh(neighbour.body.id, "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1")).stdout.trim();
    await sh(neighbour.body.id, `nc -l -p ${LEAK_PORT} > /tmp/got 2>&1 &`);
    const hostListener = spawn('nsenter', [`--net=/run/netns/${fw.host.name}`, '--', 'busybox', 'nc', '-l', '-p', String(LEAK_PORT)], { stdio: ['ignore', 'pipe', 'ignore'] });
    let hostHeard = '';
    hostListener.stdout.on('data', (d: Buffer) => (hostHeard += d.toString()));
    const widened = await api(cluster, token, 'PATCH', `/v1/sandboxes/${id}/policy`, {
      network: { mode: 'allowlist', allow: [{ host: 'allowed.name', ports: [PORT_A, HOLD_PORT] }, ...[neighbourAddress, fw.target.hostAddress, ...fw.host.addresses].map((a) => ({ cidr: `${a}/32`, protocol: 'any' }))] },
    });
    expect(widened.status, JSON.stringify(widened.body)).toBe(200);
    for (const address of [neighbourAddress, fw.target.hostAddress, ...fw.host.addresses]) expect((await sh(id, `echo leak | nc -w 2 ${address} ${LEAK_PORT}; echo "exit=$?"`)).stdout).toMatch(/exit=[1-9]/);
    expect((await sh(neighbour.body.id, 'cat /tmp/got')).stdout).toBe('');
    expect(hostHeard).toBe('');
    expect(hostListener.exitCode).toBeNull();
    hostListener.kill('SIGKILL');
    expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${neighbour.body.id}`)).status).toBe(200);

    // A line every 100 ms keeps stdin open (and makes nc notice a cut at its next write); fed from /dev/zero, busybox nc
    // blocked writing to a peer that never reads, within milliseconds, and never read a tick (the flake this test had).
    await sh(id, `((while :; do echo x; sleep 0.1; done) | nc ${fw.target.address} ${HOLD_PORT} > /tmp/ticks 2>&1; echo ended > /tmp/ended) >/dev/null 2>&1 &`);
    await waitFor('ticks flowing', async () => (await sh(id, 'wc -l < /tmp/ticks')).stdout.trim() !== '0', 30_000).catch(async (err: Error) => {
      // Should it time out again: what the sandbox and the target saw.
      const seen = (await sh(id, 'echo ticks:; cat /tmp/ticks; echo ended:; cat /tmp/ended; netstat -tn; ps')).stdout;
      throw new Error(`${err.message}\n${seen}\ntarget's connections to ${HOLD_PORT}: ${JSON.stringify(fw.target.connections(HOLD_PORT))}`);
    });
    const narrowed = await api(cluster, token, 'PATCH', `/v1/sandboxes/${id}/policy`, { network: { mode: 'allowlist', allow: [{ host: 'allowed.name', ports: [PORT_A] }] } });
    expect(narrowed.status, JSON.stringify(narrowed.body)).toBe(200);
    await waitFor('the held connection to end', async () => (await sh(id, 'cat /tmp/ended 2>/dev/null')).stdout.includes('ended'), 30_000);
    expect(await reaches(id, 'allowed.name', PORT_A)).toBe(true);
    expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)).status).toBe(200);
  }, 120_000);

  it("puts its rules back when the firewall's owner flushes them (a dockerd or firewall restart)", async () => {
    const tag = `rollbox:${fw.nodeId}`;
    expect(fw.host.rulesets()).toContain(tag);
    fw.host.flushFirewall();
    expect(fw.host.rulesets()).not.toContain(tag);
    await waitFor('the rules back', async () => fw.host.rulesets().includes(tag), 30_000);
    const heartbeat = await waitFor('a round after the put-back', async () => {
      const hb = await heartbeatOf(fw.nodeId);
      return hb?.network?.putBack ? hb : undefined;
    }, 30_000);
    expect(heartbeat.network?.allowlist).toBe('ok');
    const created = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 }, network: { mode: 'allowlist', allow: [{ host: 'allowed.name', ports: [PORT_A] }] } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    expect(await reaches(created.body.id, 'allowed.name', PORT_A)).toBe(true);
    expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${created.body.id}`)).status).toBe(200);
  }, 60_000);

  it('leaves the host exactly as it found it when the worker stops', async () => {
    await stopWorker(fw);
    expect(fw.host.rulesets()).toBe(fw.before);
    expect(fw.host.ipForward()).toBe('0');
  });
});

describe('on a host whose forward path rollbox cannot open', () => {
  const host = firewalledHostFor('prerouting-drop', 4);
  let fw: FirewalledHost;
  beforeAll(() => {
    fw = host();
  });

  it('reports the failing self-test and its cause in the heartbeat', async () => {
    const heartbeat = await waitFor('the worker heartbeat', () => heartbeatOf(fw.nodeId), 30_000);
    expect(heartbeat.network?.allowlist).toBe('failing');
    expect(heartbeat.network?.detail).toContain('was not reachable from a sandbox network');
    // The rule set in the way is named.
    expect(heartbeat.network?.detail).toContain('nft ip edge early (hook prerouting');
  });

  it('never receives an allowlist sandbox: the caller gets network_unavailable naming the cause; other sandboxes still start', async () => {
    const sandboxesBefore = (await api(cluster, token, 'GET', '/v1/sandboxes')).body.sandboxes.length;
    const refused = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 }, network: { mode: 'allowlist', allow: [{ cidr: `${fw.target.address}/32` }] } });
    expect(refused.status).toBe(503);
    expect(refused.body.error.code).toBe('network_unavailable');
    expect(refused.body.error.message).toContain(fw.nodeId);
    expect(refused.body.error.message).toContain('hook prerouting');
    expect(refused.headers.get('retry-after')).toBe('30');
    expect((await api(cluster, token, 'GET', '/v1/sandboxes')).body.sandboxes).toHaveLength(sandboxesBefore);

    const plain = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 } });
    expect(plain.status, JSON.stringify(plain.body)).toBe(201);
    // Nor can a later stage give it the network.
    const staged = await api(cluster, token, 'PATCH', `/v1/sandboxes/${plain.body.id}/policy`, { network: { mode: 'allowlist', allow: [{ cidr: `${fw.target.address}/32` }] } });
    expect(staged.status).toBe(503);
    expect(staged.body.error.code).toBe('network_unavailable');
    expect(await reaches(plain.body.id, fw.target.address, PORT_A)).toBe(false);
    expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${plain.body.id}`)).status).toBe(200);
  });

  it('leaves the host exactly as it found it when the worker stops', async () => {
    await stopWorker(fw);
    expect(fw.host.rulesets()).toBe(fw.before);
    expect(fw.host.ipForward()).toBe('0');
  });
});
