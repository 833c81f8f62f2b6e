import { execFileSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NodeHeartbeat } from '../src/api/index.ts';
import type { WorkerHandle } from '../src/roles/index.ts';
import { vmNetnsOf } from '../src/workers/microvm/net.ts';
import { vethOf } from '../src/workers/network/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { qemuPidsUnder } from './support/qemu.ts';
import { startTargetNetns, type TargetNetns } from './support/target-netns.ts';

/**
 * A microVM with a NIC hibernated whole and woken (on the same host, then on another one
 * sharing the layer store): the waking host leases it another address, which the guest's
 * multiplexer applies (address, default route, resolver) before any command; its
 * processes live on, and the allowlist of its current stage holds, a stage set while it
 * was hibernated included. Probes go only to a namespace this test made.
 */
const PORT_A = 7111;
const PORT_B = 7112;
const HOLD_PORT = 7113;

let cluster: TestCluster;
let hostA: WorkerHandle;
let token: string;
let target: TargetNetns;

beforeAll(async () => {
  target = await startTargetNetns({ subnet: 98, holdPort: HOLD_PORT, ports: [PORT_A, PORT_B] });
  cluster = await startTestCluster({ env: { ROLLBOX_NET_STATIC_HOSTS: `allowed.name=${target.address}`, ROLLBOX_LAYER_GC_INTERVAL_MS: '1000' } });
  hostA = await cluster.addWorker({ nodeId: 'vmnet-a' });
  token = await cluster.token('vmhnet-team', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:policy', 'sandbox:snapshot']);
}, 60_000);
afterAll(async () => {
  await cluster?.stop();
  await target?.stop();
  expect(qemuPidsUnder(cluster.rootDir)).toEqual([]);
}, 60_000);

const sh = async (id: string, cmd: string): Promise<string> => {
  const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs: 20_000 });
  expect(r.status, `${cmd}: ${JSON.stringify(r.body)}`).toBe(200);
  return r.body.stdout as string;
};
/** Whether a TCP connection from the guest, by the platform resolver's name, gets the target's greeting (nc gives up after 3 s). */
const reaches = async (id: string, port: number) => (await sh(id, `echo | nc -w 3 allowed.name ${port}`)).includes(`hello ${port}`);
const stage = (...ports: number[]) => ({ network: { mode: 'allowlist', allow: [{ host: 'allowed.name', ports }] } });
/** The guest's view: its one address, its default route, its resolver. */
const guestNet = async (id: string) => {
  const view = await sh(id, 'ip -4 -o addr show eth0; ip route; cat /etc/resolv.conf');
  const addresses = [...view.matchAll(/inet (10\.\d+\.\d+\.\d+)\/30/g)].map((m) => m[1]);
  expect(addresses, view).toHaveLength(1);
  const gateway = /default via (\S+) dev eth0/.exec(view)?.[1];
  expect(view).toContain(`nameserver ${gateway}\n`);
  // The host end of this sandbox's veth is the guest's gateway.
  expect(execFileSync('ip', ['-4', '-o', 'addr', 'show', 'dev', vethOf(id)], { encoding: 'utf8' })).toContain(`inet ${gateway}/30`);
  return { address: addresses[0]!, gateway: gateway! };
};
const noNetworkLeft = (id: string) => {
  expect(execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' })).not.toContain(vmNetnsOf(id));
  expect(execFileSync('ip', ['-o', 'link'], { encoding: 'utf8' })).not.toContain(vethOf(id));
};

describe('microVM with a NIC: hibernation keeps processes, the wake brings a new lease', () => {
  let id: string;
  let pid: string;
  let secret: string;
  let before: { address: string; gateway: string };

  const expectSameProcess = async () => {
    expect(await sh(id, `kill -0 ${pid} && echo alive`)).toBe('alive\n');
    const first = await sh(id, 'cat /tmp/beat');
    await waitFor('the process beats again', async () => (await sh(id, 'cat /tmp/beat')) !== first);
    expect((await sh(id, 'cat /tmp/beat')).split(' ')[0]).toBe(secret);
  };

  it('wakes on the same host with a new address, route and resolver; its stage holds', async () => {
    const created = await api(cluster, token, 'POST', '/v1/sandboxes', { tier: 'microvm', resources: { memoryMiB: 192, cpuMillis: 1000 }, ...stage(PORT_A) });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    id = created.body.id;
    pid = (await sh(id, 'v=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d " \\n"); (i=0; while :; do i=$((i+1)); echo "$v $i" > /tmp/beat.next; mv /tmp/beat.next /tmp/beat; sleep 0.2; done) </dev/null >/dev/null 2>&1 & echo $!')).trim();
    await waitFor('the process beats', async () => (await sh(id, 'cat /tmp/beat 2>/dev/null || true')).includes(' '));
    secret = (await sh(id, 'cat /tmp/beat')).split(' ')[0]!;
    before = await guestNet(id);
    expect(await reaches(id, PORT_A)).toBe(true);
    // Task stage B before the save: port B (and the held connection's port), not A.
    expect((await api(cluster, token, 'PATCH', `/v1/sandboxes/${id}/policy`, stage(PORT_B, HOLD_PORT))).status).toBe(200);
    // A connection held open across the save (it may break: the guest's address changes).
    await sh(id, `(sleep 600 | nc allowed.name ${HOLD_PORT} >/tmp/ticks 2>&1) </dev/null >/dev/null 2>&1 & true`);
    await waitFor('ticks over the held connection', async () => Number(await sh(id, 'wc -l < /tmp/ticks')) > 2);

    let t = Date.now();
    const hibernated = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/pause`, { mode: 'hibernate' });
    expect(hibernated.body, JSON.stringify(hibernated.body)).toMatchObject({ state: 'hibernated', hibernatedWhole: true });
    console.log(`hibernate with a NIC (TCG): ${Date.now() - t} ms`);
    expect(qemuPidsUnder(cluster.rootDir)).toEqual([]);
    noNetworkLeft(id);

    // Another lease is taken meanwhile (a container with a network): the wake cannot get the same one back by chance.
    const other = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64, cpuMillis: 200 }, network: { mode: 'allowlist', allow: [] } });
    expect(other.status, JSON.stringify(other.body)).toBe(201);
    t = Date.now();
    const woken = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/resume`, {});
    expect(woken.body, JSON.stringify(woken.body)).toMatchObject({ state: 'running', node: 'vmnet-a' });
    console.log(`wake with a NIC (TCG): ${Date.now() - t} ms`);
    const after = await guestNet(id);
    console.log(`guest address ${before.address} via ${before.gateway} -> ${after.address} via ${after.gateway}`);
    expect(after.address).not.toBe(before.address);
    await expectSameProcess();
    // Stage B holds, DNS answers by the new resolver.
    expect(await sh(id, 'nslookup allowed.name')).toContain(target.address);
    expect(await reaches(id, PORT_B)).toBe(true);
    expect(await reaches(id, PORT_A)).toBe(false);
    const ticks = await sh(id, `wc -l < /tmp/ticks; sleep 2; wc -l < /tmp/ticks; pgrep -f "nc allowed.name ${HOLD_PORT}" >/dev/null && echo nc-alive || echo nc-gone`);
    console.log(`connection held across the save (ticks, 2 s later, its nc): ${ticks.replace(/\n/g, ' ')}`);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${other.body.id}`);
  }, 240_000);

  it('wakes on another host sharing the layer store, with a stage set while it was hibernated', async () => {
    const hibernated = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/pause`, { mode: 'hibernate' });
    expect(hibernated.body, JSON.stringify(hibernated.body)).toMatchObject({ state: 'hibernated' });
    noNetworkLeft(id);
    // Stage C while hibernated: applied when it wakes.
    const patched = await api(cluster, token, 'PATCH', `/v1/sandboxes/${id}/policy`, stage(PORT_A));
    expect(patched.status, JSON.stringify(patched.body)).toBe(200);
    await cluster.addWorker({ nodeId: 'vmnet-b' });
    await hostA.stop({ destroySandboxes: true });
    const admin = await cluster.token('ops', ['admin']);
    await waitFor('only vmnet-b is healthy', async () => {
      const nodes = (await api<{ nodes: NodeHeartbeat[] }>(cluster, admin, 'GET', '/v1/nodes')).body.nodes ?? [];
      return nodes.filter((n) => n.healthy).map((n) => n.nodeId).join() === 'vmnet-b';
    });
    const woken = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/resume`, {});
    expect(woken.body, JSON.stringify(woken.body)).toMatchObject({ state: 'running', node: 'vmnet-b' });
    const after = await guestNet(id);
    console.log(`woken on vmnet-b: ${after.address} via ${after.gateway}`);
    await expectSameProcess();
    expect(await sh(id, 'nslookup allowed.name')).toContain(target.address);
    expect(await reaches(id, PORT_A)).toBe(true);
    expect(await reaches(id, PORT_B)).toBe(false);
    // And a stage change after the wake applies on the new host.
    expect((await api(cluster, token, 'PATCH', `/v1/sandboxes/${id}/policy`, stage(PORT_B))).status).toBe(200);
    expect(await reaches(id, PORT_B)).toBe(true);
    expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)).body).toMatchObject({ state: 'terminated' });
    expect(qemuPidsUnder(cluster.rootDir)).toEqual([]);
    noNetworkLeft(id);
  }, 240_000);
});
