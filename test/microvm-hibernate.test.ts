import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NodeHeartbeat } from '../src/api/index.ts';
import type { WorkerHandle } from '../src/roles/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { qemuPidsUnder } from './support/qemu.ts';

/**
 * A microVM hibernated whole: its RAM file and device state saved to the shared layer
 * store, no QEMU left; a wake (on the same host, then on another one sharing the store)
 * restores every process as it was, with the guest's clock set to now. Real QEMU (TCG
 * here), gateway, Redis and two worker hosts over one layer store.
 */
let cluster: TestCluster;
let hostA: WorkerHandle;
let token: string;
const RAM_DIR = '/dev/shm';

beforeAll(async () => {
  cluster = await startTestCluster({ env: { ROLLBOX_LAYER_GC_INTERVAL_MS: '1000' } });
  hostA = await cluster.addWorker({ nodeId: 'vm-a' });
  token = await cluster.token('vm-team', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:snapshot']);
}, 60_000);
afterAll(async () => {
  await cluster?.stop();
  expect(qemuPidsUnder(cluster.rootDir)).toEqual([]);
  expect(fs.readdirSync(RAM_DIR).filter((n) => n.startsWith('rollbox-vm-ram-vm-'))).toEqual([]);
});

const exec = async (id: string, cmd: string): Promise<string> => {
  const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd });
  expect(r.body.exitCode, `${cmd}: ${JSON.stringify(r.body)}`).toBe(0);
  return (r.body.stdout as string).trim();
};
const imageDir = (id: string) => path.join(cluster.rootDir, 'layers', 'hibernated', id);
const ramFile = (node: string, id: string) => path.join(RAM_DIR, `rollbox-vm-ram-${node}`, `${id}.ram`);

describe('microVM hibernation keeps processes', () => {
  let id: string;
  let pid: string;
  let secret: string;
  let blobSha: string;

  /** The background process is the one started before, holding the value it was started with, and still running. */
  const expectSameProcesses = async () => {
    expect(await exec(id, `kill -0 ${pid} && echo alive`)).toBe('alive');
    const first = await exec(id, 'cat /tmp/beat');
    await waitFor('the process beats again', async () => (await exec(id, 'cat /tmp/beat')) !== first);
    expect((await exec(id, 'cat /tmp/beat')).split(' ')[0]).toBe(secret);
    // The guest's tmpfs lives in its RAM: 64 MiB of it come back byte for byte.
    expect(await exec(id, 'sha256sum /dev/shm/blob | cut -d" " -f1')).toBe(blobSha);
    // The guest's wall clock is the host's again, though it stood still while saved.
    // (Bounded by the host's clock before and after the command, so a slow exec on a loaded host is not a drift.
    // The guest corrects the time the host sent by round trips, to within half the shortest
    // one, which a TCG guest on a loaded host can make long: 3 s are allowed, far less than it stood saved.)
    const before = Date.now() / 1000;
    const guestNow = Number(await exec(id, 'date +%s'));
    expect(guestNow).toBeGreaterThanOrEqual(Math.floor(before) - 3);
    expect(guestNow).toBeLessThanOrEqual(Date.now() / 1000 + 1);
  };

  it('saves a VM to the layer store and ends its QEMU; a wake brings back every process as it was', async () => {
    const created = await api(cluster, token, 'POST', '/v1/sandboxes', { tier: 'microvm', resources: { memoryMiB: 256, cpuMillis: 1000 } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    id = created.body.id;
    // A value only the process holds (in a shell variable), written out every 200 ms with a count. It runs on
    // after the command that started it ended (a command still running is carried through a wake: below).
    pid = await exec(id, 'v=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d " \\n"); (i=0; while :; do i=$((i+1)); echo "$v $i" > /tmp/beat.next; mv /tmp/beat.next /tmp/beat; sleep 0.2; done) </dev/null >/dev/null 2>&1 & echo $!');
    await waitFor('the process beats', async () => (await exec(id, 'cat /tmp/beat 2>/dev/null || true')).includes(' '));
    secret = (await exec(id, 'cat /tmp/beat')).split(' ')[0]!;
    blobSha = await exec(id, 'head -c 67108864 /dev/urandom > /dev/shm/blob && sha256sum /dev/shm/blob | cut -d" " -f1');
    expect(fs.existsSync(ramFile('vm-a', id))).toBe(true);

    const hibernatedAt = Date.now();
    const hibernated = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/pause`, { mode: 'hibernate' });
    expect(hibernated.body, JSON.stringify(hibernated.body)).toMatchObject({ state: 'hibernated', hibernatedWhole: true });
    console.log(`hibernate (TCG): ${Date.now() - hibernatedAt} ms`);
    expect(qemuPidsUnder(cluster.rootDir)).toEqual([]);
    expect(fs.existsSync(ramFile('vm-a', id))).toBe(false);
    expect(fs.readdirSync(imageDir(id)).sort()).toEqual(['devices', 'disk.ext4', 'ram', 'vm.json']);

    await new Promise((r) => setTimeout(r, 3000));
    const wokeAt = Date.now();
    const woken = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/resume`, {});
    expect(woken.body, JSON.stringify(woken.body)).toMatchObject({ state: 'running', node: 'vm-a' });
    console.log(`wake (TCG): ${Date.now() - wokeAt} ms`);
    expect(woken.body.hibernatedWhole).toBeUndefined();
    expect(fs.existsSync(imageDir(id))).toBe(false);
    await expectSameProcesses();
  }, 180_000);

  it('wakes on another host that shares the layer store, with a command running through it: the same command, output whole, stdin, signals, result', async () => {
    // A server as a background command: it ticks, answers each line of its stdin, and ends on TERM with a status of its own.
    const server = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, {
      cmd: 'trap \'echo "term after $i"; exit 7\' TERM; i=0; while :; do i=$((i+1)); echo "tick $i"; if read -t 1 line; then echo "answer $line"; fi; done',
      background: true,
      stdinOpen: true,
    });
    expect(server.status, JSON.stringify(server.body)).toBe(202);
    const commandId = server.body.commandId as string;
    const status = async () => (await api(cluster, token, 'GET', `/v1/sandboxes/${id}/commands/${commandId}`)).body;
    const input = async (data: string) => {
      const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/commands/${commandId}/stdin`, { data });
      expect(r.body, JSON.stringify(r.body)).toMatchObject({ state: 'running' });
    };
    await input('before\n');
    await waitFor('the server answered before the hibernation', async () => ((await status()).stdout as string).includes('answer before'));
    const hibernated = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/pause`, { mode: 'hibernate' });
    expect(hibernated.body, JSON.stringify(hibernated.body)).toMatchObject({ state: 'hibernated' });
    await cluster.addWorker({ nodeId: 'vm-b' });
    // vm-a goes away: the wake can only land on vm-b.
    await hostA.stop({ destroySandboxes: true });
    const admin = await cluster.token('ops', ['admin']);
    let nodes: NodeHeartbeat[] = [];
    await waitFor('only vm-b is healthy', async () => {
      nodes = (await api<{ nodes: NodeHeartbeat[] }>(cluster, admin, 'GET', '/v1/nodes')).body.nodes ?? [];
      return nodes.filter((n) => n.healthy).map((n) => n.nodeId).join() === 'vm-b';
    }).catch((err: Error) => {
      throw new Error(`${err.message}: ${JSON.stringify(nodes.map((n) => [n.nodeId, n.healthy]))}`);
    });
    const woken = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/resume`, {});
    expect(woken.body, JSON.stringify(woken.body)).toMatchObject({ state: 'running', node: 'vm-b' });
    expect(fs.existsSync(ramFile('vm-b', id))).toBe(true);
    await expectSameProcesses();

    // The same command, attached on vm-b: still running, its output from its first line on, and it answers.
    const attached = await status();
    expect(attached.state).toBe('running');
    expect(attached.stdout).toMatch(/^tick 1\n/);
    expect(attached.stdout).toContain('answer before');
    await input('after\n');
    await waitFor('the server answered after the wake', async () => ((await status()).stdout as string).includes('answer after'));
    const signalled = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/commands/${commandId}/signal`, { signal: 'TERM' });
    expect(signalled.body, JSON.stringify(signalled.body)).toMatchObject({ state: 'running' });
    await waitFor('the server ended', async () => (await status()).state !== 'running');
    const ended = await status();
    expect(ended.state, JSON.stringify(ended)).toBe('done');
    expect(ended.result.exitCode).toBe(7);
    const stdout = ended.result.stdout as string;
    expect(stdout).toMatch(/term after \d+\n$/);
    // Whole: every tick once, in order, across the hibernation and the move.
    const ticks = [...stdout.matchAll(/^tick (\d+)$/gm)].map((m) => Number(m[1]));
    expect(ticks).toEqual(ticks.map((_, i) => i + 1));
    expect(stdout.indexOf('answer before')).toBeLessThan(stdout.indexOf('answer after'));
  }, 240_000);

  it('refuses what it cannot keep, coded: a files-only fork of a VM hibernated whole (a VM with a NIC: microvm-hibernate-net.test.ts)', async () => {
    const hibernated = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/pause`, { mode: 'hibernate' });
    expect(hibernated.body, JSON.stringify(hibernated.body)).toMatchObject({ state: 'hibernated' });
    // Its processes fork (microvm-fork.test.ts); its files alone would need its disk, which the host never reads.
    const fork = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/fork`, { count: 1, processes: false });
    expect(fork.body.error?.code, JSON.stringify(fork.body)).toBe('tier_unsupported');
  }, 120_000);

  it('deleting a VM hibernated whole leaves no image once layer GC has run', async () => {
    expect(fs.existsSync(imageDir(id))).toBe(true);
    const deleted = await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
    expect(deleted.body, JSON.stringify(deleted.body)).toMatchObject({ state: 'terminated' });
    await waitFor('the image is collected', async () => !fs.existsSync(imageDir(id)), 30_000);
  }, 60_000);
});
