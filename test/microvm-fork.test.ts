import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ForkResult } from '../src/api/index.ts';
import { vmNetnsOf } from '../src/workers/microvm/net.ts';
import { vethOf } from '../src/workers/network/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { qemuPidsUnder } from './support/qemu.ts';
import { startTargetNetns, type TargetNetns } from './support/target-netns.ts';

/**
 * Forks of a microVM that keep its processes: one save of the VM (memory, devices, disk),
 * restored N times, each child renamed, its clock set and its entropy reseeded, with its own
 * network lease. Real QEMU (TCG here), gateway, Redis, one worker host; one parent VM (with a
 * NIC to a namespace this test made) reused by every case, to keep the boots few.
 */
const PORT = 7121;
/** A second port of the target, for a child given another stage than its parent's. */
const OTHER_PORT = 7123;
const RAM_DIR = '/dev/shm';
/** Room for the parent and the children of each case (64 MiB reserved each); the capacity case asks more of each child. */
const NODE_MEMORY_MIB = 450;

let cluster: TestCluster;
let token: string;
let target: TargetNetns;

beforeAll(async () => {
  target = await startTargetNetns({ subnet: 93, holdPort: PORT + 1, ports: [PORT, OTHER_PORT] });
  cluster = await startTestCluster({
    // A short command grace: a command left running in a child's init past it would be killed, unless released (the rule checked below).
    workers: [{ nodeId: 'vmfork-a', env: { ROLLBOX_NODE_MEMORY_MIB: String(NODE_MEMORY_MIB), ROLLBOX_COMMAND_GRACE_MS: '1000' } }],
    env: { ROLLBOX_NET_STATIC_HOSTS: `allowed.name=${target.address}` },
  });
  token = await cluster.token('vmfork-team', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:policy', 'sandbox:snapshot']);
}, 60_000);
afterAll(async () => {
  await cluster?.stop();
  await target?.stop();
  if (!cluster) return;
  expect(qemuPidsUnder(cluster.rootDir)).toEqual([]);
  expect(fs.readdirSync(RAM_DIR).filter((n) => n.startsWith('rollbox-vm-ram-vmfork-'))).toEqual([]);
}, 60_000);

const sh = async (id: string, cmd: string): Promise<string> => {
  const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs: 30_000 });
  expect(r.status, `${cmd}: ${JSON.stringify(r.body)}`).toBe(200);
  expect(r.body.exitCode, `${cmd}: ${JSON.stringify(r.body)}`).toBe(0);
  return (r.body.stdout as string).trim();
};
const fork = (id: string, body: object, headers: Record<string, string> = {}) => api<ForkResult & { error?: { code: string; message: string } }>(cluster, token, 'POST', `/v1/sandboxes/${id}/fork`, body, headers);
const childIds = (r: ForkResult) => r.children.filter((c) => c.id && c.state === 'running').map((c) => c.id!);
const forkImages = () => fs.readdirSync(path.join(cluster.rootDir, 'layers', 'vmforks'), { withFileTypes: true }).map((e) => e.name);
const remove = async (ids: string[]) => {
  for (const id of ids) expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)).status).toBeLessThan(300);
};
/** Nothing of a deleted VM is left on the host: its QEMU, RAM file, namespace, veth, cgroup. */
const nothingLeftOf = (ids: string[]) => {
  const ramFiles = ['a', 'b'].flatMap((host) => {
    const ramDir = path.join(RAM_DIR, `rollbox-vm-ram-vmfork-${host}`);
    return fs.existsSync(ramDir) ? fs.readdirSync(ramDir) : [];
  });
  const netns = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' });
  const links = execFileSync('ip', ['-o', 'link'], { encoding: 'utf8' });
  const cgroups = execFileSync('find', ['/sys/fs/cgroup/memory/', '-maxdepth', '4', '-name', 'vm-*'], { encoding: 'utf8' });
  for (const id of ids) {
    expect(ramFiles).not.toContain(`${id}.ram`);
    expect(netns).not.toContain(vmNetnsOf(id));
    expect(links).not.toContain(vethOf(id));
    expect(cgroups).not.toContain(`vm-${id}`);
  }
};

describe('microVM fork keeps processes', () => {
  let parent: string;
  let pid: string;
  let secret: string;
  let blobSha: string;
  let parentAddress: string;
  /** A child of the first fork, kept to see it outlive its parent. */
  let survivor: string;

  /** The detached process is there, with the value the parent's had, and counts on. */
  const expectParentsProcess = async (id: string) => {
    expect(await sh(id, `kill -0 ${pid} && echo alive`)).toBe('alive');
    const first = await sh(id, 'cat /tmp/beat');
    await waitFor(`the process beats on in ${id}`, async () => (await sh(id, 'cat /tmp/beat')) !== first);
    const [value, count] = (await sh(id, 'cat /tmp/beat')).split(' ');
    expect(value).toBe(secret);
    return Number(count);
  };
  const addressOf = async (id: string) => /inet (10\.\d+\.\d+\.\d+)\/30/.exec(await sh(id, 'ip -4 -o addr show eth0'))![1]!;

  it('forks a running VM into 3: each has the same process, value and tmpfs, its own name, clock, entropy and address; the parent runs on', async () => {
    const created = await api(cluster, token, 'POST', '/v1/sandboxes', { tier: 'microvm', resources: { memoryMiB: 192, cpuMillis: 1000 }, network: { mode: 'allowlist', allow: [{ host: 'allowed.name', ports: [PORT] }] } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    parent = created.body.id;
    // A value only the process holds (a shell variable), written out every 200 ms with a count.
    pid = await sh(parent, 'v=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d " \\n"); (i=0; while :; do i=$((i+1)); echo "$v $i" > /tmp/beat.next; mv /tmp/beat.next /tmp/beat; sleep 0.2; done) </dev/null >/dev/null 2>&1 & echo $!');
    await waitFor('the process beats', async () => (await sh(parent, 'cat /tmp/beat 2>/dev/null || true')).includes(' '));
    secret = (await sh(parent, 'cat /tmp/beat')).split(' ')[0]!;
    blobSha = await sh(parent, 'head -c 16777216 /dev/urandom > /dev/shm/blob && echo on-disk > /root/file && sha256sum /dev/shm/blob | cut -d" " -f1');
    parentAddress = await addressOf(parent);
    // A command still running at the fork point: its caller gets its result from the parent; in
    // each child it runs to its end (past the init's grace for commands nobody holds), unseen.
    const running = await api(cluster, token, 'POST', `/v1/sandboxes/${parent}/exec`, { cmd: 'sleep 4; echo finished > /tmp/cmd-done; echo out', background: true });
    expect(running.status, JSON.stringify(running.body)).toBe(202);

    const startedAt = Date.now();
    const forked = await fork(parent, { count: 3, labels: { branch: 'b' } });
    const forkMs = Date.now() - startedAt;
    expect(forked.status, JSON.stringify(forked.body)).toBe(201);
    expect(forked.body).toMatchObject({ parent, parentKind: 'sandbox', processes: true, created: 3, refused: 0, detachedCommands: [running.body.commandId] });
    expect(forked.body.forkLayer).toBeUndefined();
    console.log(`microVM fork into 3 (TCG): ${forkMs} ms to all running, parent frozen ${forked.body.parentFrozenMs?.toFixed(1)} ms`);
    expect(forked.body.parentFrozenMs).toBeGreaterThan(0);
    const children = childIds(forked.body);
    expect(children).toHaveLength(3);
    // The image went once every child had started.
    expect(forkImages()).toEqual([]);

    const parentName = await sh(parent, 'hostname');
    expect(parentName).toBe(`rb-${parent}`);
    const names = new Set([parentName]);
    const randoms = new Set<string>();
    const addresses = new Set([parentAddress]);
    const counts: number[] = [];
    for (const child of children) {
      const record = await api(cluster, token, 'GET', `/v1/sandboxes/${child}`);
      expect(record.body).toMatchObject({ state: 'running', spec: { tier: 'microvm', labels: { branch: 'b' } }, lineage: { parent, parentKind: 'sandbox', forkPoint: forked.body.forkPoint, processes: true } });
      counts.push(await expectParentsProcess(child));
      expect(await sh(child, 'sha256sum /dev/shm/blob | cut -d" " -f1; cat /root/file')).toBe(`${blobSha}\non-disk`);
      names.add(await sh(child, 'hostname'));
      randoms.add(await sh(child, 'head -c 16 /dev/urandom | od -An -tx1 | tr -d " \\n"'));
      // Set to the host's time, corrected by round trips (within half the shortest, long for a TCG guest on a loaded host).
      expect(Math.abs(Number(await sh(child, 'date +%s')) - Date.now() / 1000)).toBeLessThan(5);
      // Its own lease (the net frame): its address, and the allowlist it inherited, work.
      addresses.add(await addressOf(child));
      expect(await sh(child, `echo | nc -w 3 allowed.name ${PORT}`)).toContain(`hello ${PORT}`);
      // Nothing of the parent's command in its log; its process ran on, detached.
      const log = (await api(cluster, token, 'GET', `/v1/sandboxes/${child}/commands`)).body.commands as { commandId: string }[];
      expect(log.map((c) => c.commandId)).not.toContain(running.body.commandId);
    }
    expect([...names].sort()).toEqual([parent, ...children].map((id) => `rb-${id}`).sort());
    expect(randoms.size).toBe(3);
    expect(addresses.size).toBe(4);
    // Each counts on by itself: every child gets further along than it was.
    for (const [i, child] of children.entries()) await waitFor(`${child} counts on`, async () => Number((await sh(child, 'cat /tmp/beat')).split(' ')[1]) > counts[i]!);

    // The parent's command ends for its caller; in each child its process finished too, unseen.
    await waitFor('the parent command ends', async () => (await api(cluster, token, 'GET', `/v1/sandboxes/${parent}/commands/${running.body.commandId}`)).body.state !== 'running');
    const result = await api(cluster, token, 'GET', `/v1/sandboxes/${parent}/commands/${running.body.commandId}`);
    expect(result.body).toMatchObject({ result: { exitCode: 0 }, stdout: 'out\n' });
    for (const child of children) await waitFor(`the detached command ends in ${child}`, async () => (await sh(child, 'cat /tmp/cmd-done 2>/dev/null || true')) === 'finished');

    // A write in one child is its own.
    await sh(children[0]!, 'echo mine > /root/file && echo mine > /dev/shm/note');
    for (const id of [parent, ...children.slice(1)]) expect(await sh(id, 'cat /root/file; cat /dev/shm/note 2>/dev/null || echo none')).toBe('on-disk\nnone');
    // The parent ran on.
    await expectParentsProcess(parent);
    survivor = children[1]!;
    await remove([children[0]!, children[2]!]);
    nothingLeftOf([children[0]!, children[2]!]);
  }, 240_000);

  it('forks a paused VM as it is (the parent stays paused, not frozen again); an Idempotency-Key forks once', async () => {
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${parent}/pause`, { mode: 'freeze' })).body.state).toBe('paused');
    const headers = { 'idempotency-key': `vmfork-${parent}` };
    const forked = await fork(parent, { count: 1 }, headers);
    expect(forked.status, JSON.stringify(forked.body)).toBe(201);
    expect(forked.body).toMatchObject({ processes: true, created: 1, parentFrozenMs: 0 });
    const [child] = childIds(forked.body);
    const again = await fork(parent, { count: 1 }, headers);
    expect(again.status, JSON.stringify(again.body)).toBe(200);
    expect(childIds(again.body)).toEqual([child]);
    // Saved again as it is (QEMU left it in its post-migration state: a second save, then the resume, take it from there).
    const second = await fork(parent, { count: 1 });
    expect(second.body, JSON.stringify(second.body)).toMatchObject({ processes: true, created: 1, parentFrozenMs: 0 });
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${parent}`)).body.state).toBe('paused');
    // The children run (a paused parent's sandbox was frozen in its guest: the restore thaws it).
    for (const id of [child!, ...childIds(second.body)]) {
      await expectParentsProcess(id);
      expect(await sh(id, 'hostname')).toBe(`rb-${id}`);
    }
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${parent}/resume`, {})).body.state).toBe('running');
    await expectParentsProcess(parent);
    await remove([child!, ...childIds(second.body)]);
  }, 120_000);

  it('forks a VM hibernated whole from its saved image without waking it; the parent wakes as it was after; deleting it leaves its children', async () => {
    const hibernated = await api(cluster, token, 'POST', `/v1/sandboxes/${parent}/pause`, { mode: 'hibernate' });
    expect(hibernated.body, JSON.stringify(hibernated.body)).toMatchObject({ state: 'hibernated', hibernatedWhole: true });
    // The child gets its own stage: another port than the parent's allowlist.
    const forked = await fork(parent, { count: 1, network: { mode: 'allowlist', allow: [{ host: 'allowed.name', ports: [OTHER_PORT] }] } });
    expect(forked.status, JSON.stringify(forked.body)).toBe(201);
    expect(forked.body).toMatchObject({ processes: true, created: 1 });
    expect(forked.body.parentFrozenMs).toBeUndefined();
    const [child] = childIds(forked.body);
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${parent}`)).body).toMatchObject({ state: 'hibernated', hibernatedWhole: true });
    expect(forkImages()).toEqual([]);
    await expectParentsProcess(child!);
    expect(await sh(child!, 'sha256sum /dev/shm/blob | cut -d" " -f1; hostname')).toBe(`${blobSha}\nrb-${child}`);
    expect(await addressOf(child!)).not.toBe(parentAddress);
    expect(await sh(child!, `echo | nc -w 3 allowed.name ${OTHER_PORT}`)).toContain(`hello ${OTHER_PORT}`);
    expect(await sh(child!, `echo | nc -w 3 allowed.name ${PORT} || echo refused`)).toBe('refused');

    const woken = await api(cluster, token, 'POST', `/v1/sandboxes/${parent}/resume`, {});
    expect(woken.body, JSON.stringify(woken.body)).toMatchObject({ state: 'running' });
    await expectParentsProcess(parent);
    expect(await sh(parent, 'hostname')).toBe(`rb-${parent}`);

    await remove([parent]);
    for (const id of [child!, survivor]) await expectParentsProcess(id);
    await remove([child!, survivor]);
    nothingLeftOf([parent, child!, survivor]);
  }, 120_000);
});

describe('microVM fork: what it refuses, coded', () => {
  let vm: string;

  it('answers what a restored child cannot be with coded errors, before the parent is stopped', async () => {
    const created = await api(cluster, token, 'POST', '/v1/sandboxes', { tier: 'microvm', resources: { memoryMiB: 160, cpuMillis: 1000 } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    vm = created.body.id;
    await sh(vm, '(while :; do sleep 0.2; done) </dev/null >/dev/null 2>&1 &');
    const refusals: [object, number, string][] = [
      [{ count: 1, resources: { memoryMiB: 256 } }, 400, 'invalid_request'],
      [{ count: 1, resources: { cpuMillis: 1500 } }, 400, 'invalid_request'],
      [{ count: 1, resources: { diskMiB: 2048 } }, 400, 'invalid_request'],
      [{ count: 1, snapshot: {} }, 400, 'invalid_request'],
      // No NIC to restore: a child cannot get one.
      [{ count: 1, network: { mode: 'allowlist', allow: [{ host: 'allowed.name', ports: [PORT] }] } }, 501, 'tier_unsupported'],
    ];
    for (const [body, status, code] of refusals) {
      const r = await fork(vm, body);
      expect([r.status, r.body.error?.code], JSON.stringify(r.body)).toEqual([status, code]);
    }
    expect(forkImages()).toEqual([]);
    // Files only, asked: a fresh VM of another size over the parent's files.
    const files = await fork(vm, { count: 1, processes: false, resources: { memoryMiB: 192 } });
    expect(files.status, JSON.stringify(files.body)).toBe(201);
    expect(files.body).toMatchObject({ processes: false, created: 1 });
    await remove(childIds(files.body));
    // A container cannot keep processes.
    const container = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    const refused = await fork(container.body.id, { count: 1, processes: true });
    expect([refused.status, refused.body.error?.code], JSON.stringify(refused.body)).toEqual([501, 'tier_unsupported']);
    await remove([container.body.id]);
  }, 120_000);

  it('children refused for capacity are reported with their code, the rest created, nothing left of them; a child without a NIC stays without', async () => {
    const before = qemuPidsUnder(cluster.rootDir).length;
    // Each child reserves all of its 160 MiB: two fit beside the parent's 64 in the host's 450, the third does not.
    const forked = await fork(vm, { count: 3, resources: { requests: { memoryMiB: 160 } } });
    expect(forked.status, JSON.stringify(forked.body)).toBe(201);
    expect(forked.body).toMatchObject({ processes: true, created: 2, refused: 1 });
    const refused = forked.body.children.filter((c) => c.state !== 'running');
    expect(refused).toHaveLength(1);
    expect(['no_capacity', 'admission_exhausted']).toContain(refused[0]!.error!.code);
    if (refused[0]!.id) expect((await api(cluster, token, 'GET', `/v1/sandboxes/${refused[0]!.id}`)).body).toMatchObject({ state: 'failed', failureReason: 'admission_exhausted' });
    expect(qemuPidsUnder(cluster.rootDir)).toHaveLength(before + 2);
    expect(forkImages()).toEqual([]);
    const children = childIds(forked.body);
    for (const child of children) expect(await sh(child, 'ls /sys/class/net; hostname')).toBe(`lo\nrb-${child}`);

    // Another host sharing the layer store: the children that do not fit beside the parent are
    // restored there from the image; a child forks again (its image saved on that host).
    await cluster.addWorker({ nodeId: 'vmfork-b', env: { ROLLBOX_NODE_MEMORY_MIB: String(NODE_MEMORY_MIB), ROLLBOX_COMMAND_GRACE_MS: '1000' } });
    const elsewhere = await fork(vm, { count: 1, resources: { requests: { memoryMiB: 160 } } });
    expect(elsewhere.body, JSON.stringify(elsewhere.body)).toMatchObject({ processes: true, created: 1 });
    const [moved] = childIds(elsewhere.body);
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${moved}`)).body.node).toBe('vmfork-b');
    const again = await fork(moved!, { count: 1 });
    expect(again.body, JSON.stringify(again.body)).toMatchObject({ processes: true, created: 1 });
    const [grandchild] = childIds(again.body);
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${grandchild}`)).body.lineage).toMatchObject({ parent: moved, processes: true });
    expect(await sh(grandchild!, 'hostname; ls /sys/class/net')).toBe(`rb-${grandchild}\nlo`);
    expect(forkImages()).toEqual([]);
    await remove([vm, ...children, moved!, grandchild!]);
    nothingLeftOf([vm, ...children, moved!, grandchild!]);
  }, 120_000);
});
