import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { qemuPidsUnder } from './support/qemu.ts';

/**
 * The microVM tier over the real stack: gateway, Redis, a worker host whose runtime starts
 * QEMU -M microvm (TCG on this machine) with Debian's cloud kernel and rollbox-init as the
 * guest's PID 1 (scripts/install-microvm.sh must have run: npm test's bootstrap does).
 */
let cluster: TestCluster;
let token: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-vm' }] });
  token = await cluster.token('vm-team', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:snapshot']);
}, 60_000);
afterAll(async () => {
  await cluster?.stop();
  expect(qemuPidsUnder(cluster.rootDir)).toEqual([]);
});

const exec = (id: string, body: object) => api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, body);
const createVm = (extra: object = {}) => api(cluster, token, 'POST', '/v1/sandboxes', { tier: 'microvm', resources: { memoryMiB: 256, cpuMillis: 1000 }, ...extra });

describe('microVM tier', () => {
  let id: string;

  it('creates a microVM sandbox, named as such, on a host that reports its accelerator', async () => {
    const admin = await cluster.token('vm-admin', ['admin']);
    const accelerator = await waitFor('the heartbeat names the accelerator', async () => {
      const nodes = await api(cluster, admin, 'GET', '/v1/nodes');
      return nodes.body.nodes?.find((n: { nodeId: string }) => n.nodeId === 'node-vm')?.tiers?.microvm?.accelerator as string | undefined;
    });
    expect(['kvm', 'tcg']).toContain(accelerator);
    const started = Date.now();
    const created = await createVm();
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    expect(created.body).toMatchObject({ state: 'running', spec: { tier: 'microvm' } });
    id = created.body.id;
    console.log(`microvm create ${Date.now() - started} ms (${accelerator})`);
    expect(qemuPidsUnder(cluster.rootDir)).toHaveLength(1);
  }, 90_000);

  it('keeps the channel the init\'s own: no port device, no way to make one, forged frames are output; no /dev/kvm, no host path mounted', async () => {
    const probe = await exec(id, {
      cmd: [
        'ls /dev | tr "\\n" " "; echo',
        'ls /sys/class/virtio-ports/ | head -n 1',
        // The port's device numbers, from sysfs; making a node of them needs CAP_MKNOD.
        'mknod /tmp/port c $(cat /sys/class/virtio-ports/$(ls /sys/class/virtio-ports | head -n 1)/dev | tr ":" " ") && echo MKNOD_OK || echo MKNOD_REFUSED',
        'mount -t devtmpfs dev /mnt 2>/dev/null && echo MOUNT_OK || echo MOUNT_REFUSED',
        // Nothing of the host's: no KVM device, no file system shared from the host (9p, virtiofs, NFS, FUSE).
        'test -e /dev/kvm && echo KVM_PRESENT || echo NO_KVM',
        'echo SHARED_MOUNTS=$(grep -c -E " (9p|virtiofs|nfs4?|fuse[.a-z]*) " /proc/mounts)',
        // A multiplexer frame (channel 1, DATA) carrying an init EXIT frame with code 0, on stdout.
        "printf '\\001\\000\\000\\000\\002\\000\\000\\000\\020\\000\\000\\000\\024\\000\\000\\000\\010\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000'",
        'exit 7',
      ].join('; '),
    });
    expect(probe.body.exitCode, JSON.stringify(probe.body)).toBe(7);
    const [devLine, portName] = (probe.body.stdout as string).split('\n');
    expect(portName).toMatch(/^vport/);
    expect(devLine).not.toMatch(/vport|console|vd[a-z]/);
    expect(probe.body.stdout).toContain('MKNOD_REFUSED');
    expect(probe.body.stdout).toContain('MOUNT_REFUSED');
    expect(probe.body.stdout).toContain('NO_KVM');
    expect(probe.body.stdout).toContain('SHARED_MOUNTS=0\n');
    // The forged bytes arrived as the command's output, not as a result.
    expect(probe.body.stdout).toContain('\u0014\u0000\u0000\u0000\u0008');
  }, 30_000);

  it('pauses the whole VM (its processes stop counting) and resumes it', async () => {
    const started = await exec(id, { argv: ['sh', '-c', 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count.next; mv /tmp/count.next /tmp/count; sleep 0.05; done'], background: true });
    expect(started.status, JSON.stringify(started.body)).toBeLessThan(300);
    const count = async (): Promise<number> => Number((await exec(id, { argv: ['cat', '/tmp/count'] })).body.stdout);
    await waitFor('the counter counts', async () => (await count()) > 3);
    const [c0, t0] = [await count(), Date.now()];
    await new Promise((r) => setTimeout(r, 1000));
    const [c1, t1] = [await count(), Date.now()];
    const perSecond = ((c1 - c0) * 1000) / (t1 - t0);
    const paused = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/pause`, { mode: 'freeze' });
    expect(paused.body, JSON.stringify(paused.body)).toMatchObject({ state: 'paused' });
    await new Promise((r) => setTimeout(r, 2000));
    const resumed = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/resume`, {});
    expect(resumed.body, JSON.stringify(resumed.body)).toMatchObject({ state: 'running' });
    // 2 s paused plus the calls: a counter that ran on would have gained 2 s worth or more.
    const c2 = await count();
    expect(c2 - c1, `counted ${perSecond.toFixed(1)}/s before the pause`).toBeLessThan(perSecond);
    await waitFor('the counter counts again', async () => (await count()) > c2 + 3);
    await api(cluster, token, 'POST', `/v1/sandboxes/${id}/commands/${started.body.commandId}/signal`, { signal: 'KILL' });
  }, 60_000);

  it('answers what the tier cannot do yet with a coded error naming it', async () => {
    const small = await api(cluster, token, 'POST', '/v1/sandboxes', { tier: 'microvm', resources: { memoryMiB: 64, cpuMillis: 1000 } });
    expect(small.body.error?.code, JSON.stringify(small.body)).toBe('tier_unsupported');
    expect(small.body.error.message).toContain('microvm');
    expect((await exec(id, { argv: ['true'] })).body.exitCode).toBe(0);
  }, 60_000);

  it('deletes: no QEMU process, socket or disk left', async () => {
    const deleted = await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
    expect(deleted.body).toMatchObject({ id, state: 'terminated' });
    expect(qemuPidsUnder(cluster.rootDir)).toEqual([]);
    expect(fs.existsSync(path.join(cluster.rootDir, 'node-vm', 'worker', 'microvm', id))).toBe(false);
  }, 30_000);

  // TTLs, commands, streaming and files: test/tiers.test.ts runs the container cases on both tiers.
  it('ends a sandbox whose VMM was SIGKILLed as failed', async () => {
    const killed = await createVm();
    expect(killed.status, JSON.stringify(killed.body)).toBe(201);
    const pid = Number(JSON.parse(fs.readFileSync(path.join(cluster.rootDir, 'node-vm', 'worker', 'microvm', killed.body.id, 'vm.json'), 'utf8')).pid);
    execFileSync('kill', ['-9', String(pid)]);
    const failed = await waitFor('the killed VM failed', async () => {
      const s = (await api(cluster, token, 'GET', `/v1/sandboxes/${killed.body.id}`)).body;
      return s.state === 'failed' && s;
    });
    expect(failed.failureReason, JSON.stringify(failed)).toBeTruthy();
    console.log(`VMM SIGKILLed: ${failed.failureReason} (${failed.detail})`);
    await waitFor('no QEMU left', async () => qemuPidsUnder(cluster.rootDir).length === 0);
  }, 120_000);
});
