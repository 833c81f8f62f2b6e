import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { vethOf } from '../src/workers/network/index.ts';
import { vmCgroupRel } from '../src/workers/microvm/cgroup.ts';
import { vmNetnsOf } from '../src/workers/microvm/net.ts';
import { discoverCgroups } from '../src/workers/runtime/cgroups.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { qemuPidsUnder } from './support/qemu.ts';

/**
 * What a microVM's guest does to itself stays its own: a command the guest kernel's OOM
 * killer takes comes back `oomKilled`, counted by the guest's init in the command's own
 * cgroup2 exec cgroup (out of the sandbox's reach); a guest that runs out of memory with
 * nothing left to kill ends `failed(oom)`; a guest kernel panic (root in the guest can
 * crash its own kernel) ends `failed(guest_panic)` with the kernel's message, the host
 * and the other sandboxes unharmed, and nothing of the VM left behind. Real QEMU (TCG).
 */
const NODE = 'node-vmfail';
const RAM_DIR = '/dev/shm';
let cluster: TestCluster;
let token: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: NODE }] });
  token = await cluster.token('vmfail-team', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
}, 60_000);
afterAll(async () => {
  await cluster?.stop();
  expect(qemuPidsUnder(cluster.rootDir)).toEqual([]);
}, 60_000);

const createVm = async (body: object = {}) => {
  const created = await api(cluster, token, 'POST', '/v1/sandboxes', { tier: 'microvm', resources: { memoryMiB: 256, cpuMillis: 1000 }, ...body });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  return created.body.id as string;
};
const exec = (id: string, cmd: string) => api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs: 60_000 });
const sandbox = async (id: string) => (await api(cluster, token, 'GET', `/v1/sandboxes/${id}`)).body;
const failed = (id: string) => waitFor(`sandbox ${id} failed`, async () => {
  const s = await sandbox(id);
  return s.state === 'failed' && s;
}, 30_000);
/** Anonymous memory the guest kernel must fault in at once: past what a 256 MiB guest has free. */
const HOG = 'dd if=/dev/zero of=/dev/null bs=210M count=1';

describe('microVM failures stay the guest\'s own', () => {
  let survivor: string;

  it('a command the guest\'s OOM killer takes is oomKilled, counted per command by the guest\'s init', async () => {
    survivor = await createVm();
    const hog = await exec(survivor, HOG);
    expect(hog.body, JSON.stringify(hog.body)).toMatchObject({ exitCode: 137, oomKilled: true });
    expect((await sandbox(survivor)).oomKills).toBe(1);
    // The next command starts from its own count (the same exec cgroup, idle again).
    const next = await exec(survivor, 'cat /proc/self/cgroup');
    expect(next.body).toMatchObject({ exitCode: 0, oomKilled: false });
    expect(next.body.stdout).toMatch(/^0::\/sandbox\/a\d+\n$/);
    expect((await sandbox(survivor)).oomKills).toBe(1);
    // The counts live in the guest's cgroup2, which the sandbox can neither see nor mount.
    const probe = await exec(survivor, 'ls -A /sys/fs/cgroup | wc -l; mount -t cgroup2 none /mnt 2>/dev/null && echo MOUNTED || echo REFUSED');
    expect(probe.body.stdout).toBe('0\nREFUSED\n');
  }, 120_000);

  it('a guest kernel panic ends the sandbox failed(guest_panic); nothing of it is left, the rest runs on', async () => {
    const id = await createVm({ network: { mode: 'allowlist', allow: [] } });
    const dir = path.join(cluster.rootDir, NODE, 'worker', 'microvm', id);
    const ramFile = path.join(RAM_DIR, `rollbox-vm-ram-${NODE}`, `${id}.ram`);
    const h = await discoverCgroups();
    const cgroup = path.join(h.memory, vmCgroupRel(NODE, id, 'latency'));
    const links = () => execFileSync('ip', ['-o', 'link'], { encoding: 'utf8' });
    const netns = () => execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' });
    expect([fs.existsSync(dir), fs.existsSync(ramFile), fs.existsSync(cgroup)]).toEqual([true, true, true]);
    expect(links()).toContain(vethOf(id));
    expect(netns()).toContain(vmNetnsOf(id));

    // Root in the guest crashes its own kernel.
    const crash = await exec(id, 'echo c > /proc/sysrq-trigger');
    expect(crash.body.error?.code, JSON.stringify(crash.body)).toBe('result_unknown');
    const ended = await failed(id);
    expect(ended.failureReason, JSON.stringify(ended)).toBe('guest_panic');
    expect(ended.detail).toContain('sysrq triggered crash');
    console.log(`guest panic: ${ended.failureReason} (${ended.detail})`);

    await waitFor('the VM\'s remains are gone', async () => !fs.existsSync(dir) && !fs.existsSync(ramFile) && !fs.existsSync(cgroup));
    expect(qemuPidsUnder(cluster.rootDir)).toHaveLength(1); // the survivor's
    expect(links()).not.toContain(vethOf(id));
    expect(netns()).not.toContain(vmNetnsOf(id));
    // The host and its other sandboxes are unharmed: the other VM and a container answer.
    expect((await exec(survivor, 'echo alive')).body.stdout).toBe('alive\n');
    const container = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 128, cpuMillis: 500 } });
    expect(container.status, JSON.stringify(container.body)).toBe(201);
    expect((await exec(container.body.id, 'echo fine')).body.stdout).toBe('fine\n');
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${container.body.id}`);
  }, 120_000);

  it('a reset the guest asks for (sysrq b) ends the sandbox failed(guest_panic), naming it', async () => {
    const id = await createVm({ resources: { memoryMiB: 192, cpuMillis: 1000 } });
    expect((await exec(id, 'echo b > /proc/sysrq-trigger')).body.error?.code).toBe('result_unknown');
    const ended = await failed(id);
    expect(ended.failureReason, JSON.stringify(ended)).toBe('guest_panic');
    expect(ended.detail).toContain('sysrq: Resetting');
  }, 120_000);

  it('a guest that runs out of memory with nothing left to kill ends failed(oom)', async () => {
    // Root in the guest cannot make its kernel panic at an OOM: the sandbox's /proc/sys is read-only.
    const refused = await exec(survivor, 'echo 1 > /proc/sys/vm/panic_on_oom');
    expect(refused.body.stderr).toContain('Read-only file system');
    // A real guest OOM death, then, from a host whose QEMU gives its guests vm.panic_on_oom=1 on
    // the kernel's command line (the guest's OOM killer then panics instead of killing): a
    // QEMU of the same name that adds the word and execs the real one.
    const bin = fs.mkdtempSync(path.join(os.tmpdir(), 'rollbox-vmfail-qemu-'));
    const qemu = execFileSync('sh', ['-c', 'command -v qemu-system-x86_64'], { encoding: 'utf8' }).trim();
    fs.writeFileSync(path.join(bin, 'qemu-system-x86_64'), [
      '#!/bin/bash',
      'for a; do shift; [ "$prev" = -append ] && a="$a sysctl.vm.panic_on_oom=1"; prev=$a; set -- "$@" "$a"; done',
      `exec -a qemu-system-x86_64 ${qemu} "$@"`,
      '',
    ].join('\n'), { mode: 0o755 });
    const panicky = await startTestCluster({ workers: [{ nodeId: `${NODE}-oom`, env: { ROLLBOX_QEMU: path.join(bin, 'qemu-system-x86_64') } }] });
    try {
      const t = await panicky.token('vmfail-team', ['sandbox:create', 'sandbox:exec', 'sandbox:read']);
      const created = await api(panicky, t, 'POST', '/v1/sandboxes', { tier: 'microvm', resources: { memoryMiB: 256, cpuMillis: 1000 } });
      expect(created.status, JSON.stringify(created.body)).toBe(201);
      const id = created.body.id as string;
      const died = await api(panicky, t, 'POST', `/v1/sandboxes/${id}/exec`, { cmd: HOG, timeoutMs: 60_000 });
      expect(died.body.error?.code, JSON.stringify(died.body)).toBe('result_unknown');
      const ended = await waitFor(`sandbox ${id} failed`, async () => {
        const s = (await api(panicky, t, 'GET', `/v1/sandboxes/${id}`)).body;
        return s.state === 'failed' && s;
      }, 30_000);
      expect(ended.failureReason, JSON.stringify(ended)).toBe('oom');
      expect(ended.detail).toContain('Out of memory');
      await waitFor('its QEMU gone', async () => qemuPidsUnder(panicky.rootDir).length === 0);
    } finally {
      await panicky.stop();
      fs.rmSync(bin, { recursive: true, force: true });
    }
    // The other host's VM, past its own OOM kill, runs on; deleted, no QEMU is left.
    expect((await exec(survivor, 'echo alive')).body.stdout).toBe('alive\n');
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${survivor}`);
    await waitFor('no QEMU left', async () => qemuPidsUnder(cluster.rootDir).length === 0);
  }, 180_000);
});
