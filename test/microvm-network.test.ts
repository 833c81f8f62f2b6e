import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { startTargetNetns, type TargetNetns } from './support/target-netns.ts';
import { qemuPidsUnder } from './support/qemu.ts';
import { vmNetnsOf } from '../src/workers/microvm/net.ts';
import { vmCgroupRel } from '../src/workers/microvm/cgroup.ts';
import { discoverCgroups } from '../src/workers/runtime/cgroups.ts';
import { vethOf } from '../src/workers/network/index.ts';

/**
 * The microVM tier's network: a tap in the sandbox's own network namespace, bridged to the
 * same veth, host chain, NAT and DNS responder a container gets. Every probe goes to a
 * namespace this test made (the "target"), never anywhere else.
 */
const PORT_A = 7101;
const PORT_B = 7102;
const HOLD_PORT = 7103;
const NODE = 'node-vmnet';

let cluster: TestCluster;
let token: string;
let target: TargetNetns;
/** Every VM this file made: the checks look for their namespaces and veths only (other files' VMs may run meanwhile). */
const made: string[] = [];
const netnsOf = (ids: readonly string[]) => fs.readdirSync('/run/netns').filter((n) => ids.some((id) => n === vmNetnsOf(id)));
const vethsOf = (ids: readonly string[]) => ids.map(vethOf).filter((v) => execFileSync('ip', ['-o', 'link'], { encoding: 'utf8' }).includes(v));

beforeAll(async () => {
  target = await startTargetNetns({ subnet: 96, holdPort: HOLD_PORT, ports: [PORT_A, PORT_B] });
  cluster = await startTestCluster({ workers: [{ nodeId: NODE }], env: { ROLLBOX_NET_STATIC_HOSTS: `allowed.name=${target.address}` } });
  token = await cluster.token('vmnet-team', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:policy']);
}, 60_000);

afterAll(async () => {
  await cluster?.stop();
  await target?.stop();
  expect(qemuPidsUnder(cluster.rootDir)).toEqual([]);
  // Nothing of the VMs' networking is left: no namespace, no veth, no tap, no host table.
  expect(netnsOf(made)).toEqual([]);
  expect(vethsOf(made)).toEqual([]);
  expect(execFileSync('nft', ['list', 'tables'], { encoding: 'utf8' })).not.toContain(`rollbox-${NODE}`);
}, 60_000);

const createVm = async (network: object) => {
  const created = await api(cluster, token, 'POST', '/v1/sandboxes', { tier: 'microvm', resources: { memoryMiB: 256, cpuMillis: 1000 }, network });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  made.push(created.body.id);
  return created.body.id as string;
};
const sh = async (id: string, cmd: string): Promise<{ exitCode: number; stdout: string; stderr: string }> => {
  const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs: 20_000 });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return r.body;
};
/** Whether a TCP connection from the guest gets the target's greeting (nc gives up after 3 s). */
const reaches = async (id: string, host: string, port: number) => (await sh(id, `echo | nc -w 3 ${host} ${port}`)).stdout.includes(`hello ${port}`);
const policyTo = (ports: number[]) => ({ mode: 'allowlist', allow: [{ cidr: `${target.address}/32`, ports }] });

describe('microVM network', () => {
  it('mode none: no network interface at all, only loopback', async () => {
    const id = await createVm({ mode: 'none', allow: [] });
    expect((await sh(id, 'ls /sys/class/net | tr "\\n" " "')).stdout.trim()).toBe('lo');
    expect(netnsOf([id])).toEqual([]);
    // A NIC cannot be added to a running microvm machine: the stage change says so.
    const patched = await api(cluster, token, 'PATCH', `/v1/sandboxes/${id}/policy`, { network: policyTo([PORT_A]) });
    expect(patched.body.error?.code, JSON.stringify(patched.body)).toBe('tier_unsupported');
    expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)).status).toBe(200);
  }, 90_000);

  it('allowlist: the guest sees a container\'s view, reaches the listed address and port only, and a stage change applies', async () => {
    // By address, and by a name the platform's resolver answers (the same address).
    const id = await createVm({ mode: 'allowlist', allow: [{ cidr: `${target.address}/32`, ports: [PORT_A] }, { host: 'allowed.name', ports: [PORT_A] }] });
    const view = await sh(id, 'ip -4 -o addr show eth0; ip route; cat /etc/resolv.conf; ls /sys/class/net | tr "\\n" " "');
    const address = /inet (10\.\d+\.\d+\.\d+)\/30/.exec(view.stdout)?.[1];
    const gateway = /default via (\S+) dev eth0/.exec(view.stdout)?.[1];
    expect(address, view.stdout).toBeTruthy();
    expect(view.stdout).toContain(`nameserver ${gateway}`);
    expect(view.stdout).toMatch(/eth0 lo/);
    console.log(`guest network: ${address} via ${gateway}`);

    const t = Date.now();
    expect(await reaches(id, target.address, PORT_A)).toBe(true);
    console.log(`allowed connection ${Date.now() - t} ms`);
    // Masqueraded like a container's: the target sees a host address, never the pool's.
    const seen = target.connections(PORT_A, target.address);
    expect(seen.length).toBeGreaterThan(0);
    expect(seen.at(-1)!.from).not.toBe(address);
    // Refused ports and addresses and an A -> B stage, on both tiers: test/tiers-walls.test.ts.
    // The platform resolver answers the allowlist's names only.
    const dns = await sh(id, 'nslookup allowed.name; nslookup leak.example.com; true');
    expect(dns.stdout).toContain(target.address);
    expect(dns.stdout + dns.stderr).toMatch(/NXDOMAIN|can't find/);

    // A VM's own: a stage to none keeps the NIC with its address (nothing passes), so a later stage opens it again.
    expect((await api(cluster, token, 'PATCH', `/v1/sandboxes/${id}/policy`, { network: { mode: 'none', allow: [] } })).status).toBe(200);
    expect(await reaches(id, target.address, PORT_A)).toBe(false);
    expect((await api(cluster, token, 'PATCH', `/v1/sandboxes/${id}/policy`, { network: policyTo([PORT_B]) })).status).toBe(200);
    expect(await reaches(id, target.address, PORT_B)).toBe(true);

    expect(netnsOf([id])).toHaveLength(1);
    expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)).status).toBe(200);
    expect(netnsOf([id])).toEqual([]);
    expect(vethsOf([id])).toEqual([]);
  }, 180_000);

  it('a restarted worker adopts a live VM\'s network (rules, resolver, stages) and its own CPU quota, and removes a dead one\'s', async () => {
    // A long lost-after so the janitor does not end the sandboxes while their worker is down.
    const other = await startTestCluster({ env: { ROLLBOX_NET_STATIC_HOSTS: `allowed.name=${target.address}`, ROLLBOX_NODE_LOST_AFTER_MS: '60000' } });
    const node = 'node-vmnet2';
    try {
      const otherToken = await other.token('vmnet-team', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:policy', 'admin']);
      const child = await other.spawnWorker({ nodeId: node });
      await waitFor('the spawned worker', async () => (await api(other, otherToken, 'GET', '/v1/nodes')).body.nodes?.length === 1, 30_000);
      const network = { mode: 'allowlist', allow: [{ host: 'allowed.name', ports: [PORT_A] }] };
      const create = async (cls = 'latency') => {
        const created = await api(other, otherToken, 'POST', '/v1/sandboxes', { tier: 'microvm', class: cls, resources: { memoryMiB: 192, cpuMillis: 1000 }, network });
        expect(created.status, JSON.stringify(created.body)).toBe(201);
        made.push(created.body.id);
        return created.body.id as string;
      };
      // The kept one besteffort: a worker that dies holding it back (the besteffort guard) leaves its quota low.
      const [kept, dead] = [await create('besteffort'), await create()];
      const keptQuota = path.join((await discoverCgroups()).cpu!, vmCgroupRel(node, kept, 'besteffort'), 'cpu.cfs_quota_us');
      expect(fs.readFileSync(keptQuota, 'utf8').trim()).toBe('100000');
      // A refused exec fails here with its answer (a CI run once saw the first exec after the restart come back without stdout).
      const run = async (id: string, cmd: string) => {
        const r = await api(other, otherToken, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs: 20_000 });
        expect(r.status, JSON.stringify(r.body)).toBe(200);
        return r.body.stdout as string;
      };
      expect(await run(kept, `echo | nc -w 3 allowed.name ${PORT_A}`)).toContain(`hello ${PORT_A}`);
      // Its sandboxes' leases (its network self-test's probe has one while a round runs or is being removed).
      const leases = () => fs.readdirSync('/run/rollbox/net').filter((f) => fs.readFileSync(`/run/rollbox/net/${f}`, 'utf8').startsWith(`${node} sbx_`));
      expect(leases()).toHaveLength(2);

      const exited = new Promise((r) => child.once('close', r));
      child.kill('SIGKILL');
      await exited;
      // One VMM dies while no worker watches: its namespace, veth, lease and chain stay behind.
      const deadPid = Number(JSON.parse(fs.readFileSync(`${other.rootDir}/${node}/worker/microvm/${dead}/vm.json`, 'utf8')).pid);
      process.kill(deadPid, 'SIGKILL');
      await waitFor('the dead VMM', async () => qemuPidsUnder(other.rootDir).length === 1);
      fs.writeFileSync(keptQuota, '1000');

      await other.addWorker({ nodeId: node });
      expect(leases()).toHaveLength(1);
      expect(netnsOf([kept, dead])).toEqual([vmNetnsOf(kept)]);
      expect((await api(other, otherToken, 'GET', `/v1/sandboxes/${dead}`)).body.state).toBe('failed');
      expect(fs.readFileSync(keptQuota, 'utf8').trim()).toBe('100000'); // its own quota back
      // The adopted VM: rules intact, the platform resolver answers again, a stage change applies.
      expect(await run(kept, `echo | nc -w 3 allowed.name ${PORT_A}`)).toContain(`hello ${PORT_A}`);
      expect(await run(kept, `echo | nc -w 3 ${target.address} ${PORT_B}`)).not.toContain('hello');
      expect((await api(other, otherToken, 'PATCH', `/v1/sandboxes/${kept}/policy`, { network: policyTo([PORT_B]) })).status).toBe(200);
      expect(await run(kept, `echo | nc -w 3 ${target.address} ${PORT_B}`)).toContain(`hello ${PORT_B}`);
    } finally {
      await other.stop();
    }
    expect(qemuPidsUnder(other.rootDir)).toEqual([]);
    expect(netnsOf(made)).toEqual([]);
  }, 180_000);
});
