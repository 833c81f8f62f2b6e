import { randomBytes } from 'node:crypto';
import { pack } from 'tar-stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, startTestCluster, type TestCluster } from './support/cluster.ts';
import { qemuPidsUnder } from './support/qemu.ts';

/**
 * Hidden paths in a microVM, kept by the guest's trusted side (its multiplexer, outside
 * the sandbox): applied before the first command at create, changed by task stages,
 * unreadable to root in the guest by every route tried (the container tier's
 * test/adversarial.test.ts routes, and the VM's own: its disks, the initramfs through
 * other processes' /proc roots, user namespaces); kept while paused and through a
 * hibernation; left out of snapshots, as in a container. Real QEMU (TCG here).
 */
let cluster: TestCluster;
let token: string;
const SECRET = `ANSWER-${randomBytes(6).toString('hex')}`;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-vmhide' }] });
  token = await cluster.token('vm-hide', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:snapshot', 'sandbox:policy', 'layer:write']);
  const archive = pack();
  const chunks: Buffer[] = [];
  archive.on('data', (c: unknown) => void chunks.push(c as Buffer));
  const ended = new Promise<void>((resolve) => archive.on('end', () => resolve()));
  archive.entry({ name: 'grader/', type: 'directory', mode: 0o755 });
  archive.entry({ name: 'grader/answer.txt', mode: 0o644 }, `${SECRET}\n`);
  archive.finalize();
  await ended;
  const layer = await api(cluster, token, 'POST', '/v1/layers?name=vm-grader', new Uint8Array(Buffer.concat(chunks)), { 'content-type': 'application/x-tar' });
  expect(layer.status, JSON.stringify(layer.body)).toBe(201);
}, 60_000);
afterAll(async () => {
  await cluster?.stop();
  expect(qemuPidsUnder(cluster.rootDir)).toEqual([]);
});

const create = async (body: object = {}): Promise<string> => {
  const r = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 256, cpuMillis: 1000 }, ...body });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body.id as string;
};
const createVm = (body: object = {}) => create({ tier: 'microvm', image: { base: 'busybox', layers: ['vm-grader'] }, ...body });
const run = async (id: string, cmd: string) => (await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs: 60_000 })).body as { exitCode: number; stdout: string; stderr: string };
const sh = async (id: string, cmd: string): Promise<string> => {
  const r = await run(id, cmd);
  expect(r.exitCode, `${cmd}: ${JSON.stringify(r)}`).toBe(0);
  return r.stdout;
};
const patch = (id: string, body: object) => api(cluster, token, 'PATCH', `/v1/sandboxes/${id}/policy`, body);
const remove = (...ids: string[]) => Promise.all(ids.map((id) => api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)));
const VISIBLE = 'cat /grader/answer.txt /etc/hostname 2>&1; ls -A /grader 2>&1; true';

describe('microVM hidden paths', () => {
  it('hides before the first command, from root in the guest by every route tried', async () => {
    const vm = await createVm({ hiddenPaths: ['/grader', '/etc/hostname'] });
    // The very first command.
    expect(await sh(vm, VISIBLE)).toBe('cat: can\'t open \'/grader/answer.txt\': No such file or directory\n');
    const routes = [
      'cat /grader/answer.txt',
      'cat /proc/1/root/grader/answer.txt',
      'cat /proc/self/root/grader/answer.txt',
      'cd /proc/1/cwd && cat ./grader/answer.txt',
      // Other processes' roots: the multiplexer's is the initramfs, where the layers and the writable disk are mounted.
      'for p in /proc/[0-9]*; do cat $p/root/grader/answer.txt $p/root/layers/*/grader/answer.txt $p/root/disk/upper/grader/answer.txt; done',
      'for p in /proc/[0-9]*; do ls $p/fd/ >/dev/null && for f in $p/fd/*; do cat $f/grader/answer.txt; done; done',
      'ln /grader/answer.txt /root/hardlink; cat /root/hardlink',
      'mkdir -p /mnt/g && mount --bind /grader /mnt/g; cat /mnt/g/answer.txt',
      'umount /grader; umount -l /grader; cat /grader/answer.txt',
      'mount -t tmpfs x /mnt && mount --move /grader /mnt; cat /grader/answer.txt',
      // User namespaces are off, and root cannot turn them on (/proc/sys is read-only).
      'unshare -Urm sh -c "umount -l /grader; cat /grader/answer.txt"',
      'echo 100 > /proc/sys/user/max_user_namespaces; unshare -Urm sh -c "umount -l /grader; cat /grader/answer.txt"',
      // The layers' disks: no nodes in /dev, and no right to make one.
      'for d in /sys/block/vd*; do mknod /root/$(basename $d) b $(tr : " " < $d/dev); done; cat /root/vd* | grep -a ANSWER',
      'grep -a ANSWER /proc/kcore',
      'find / -path /proc -prune -o -path /sys -prune -o -type f -print 2>/dev/null | xargs grep -l ANSWER 2>/dev/null',
    ];
    for (const cmd of routes) {
      const r = await run(vm, cmd);
      expect(r.stdout + r.stderr, cmd).not.toContain(SECRET);
    }
    expect(await sh(vm, 'id -u; ls -A /grader | wc -l; wc -c < /etc/hostname; cat /proc/sys/user/max_user_namespaces')).toBe('0\n0\n0\n0\n');
    // Without hiddenPaths the same layer shows the file: the probes can tell the difference.
    const open = await createVm();
    expect(await sh(open, 'cat /grader/answer.txt')).toBe(`${SECRET}\n`);
    await remove(vm, open);
  }, 300_000);

  it('changes by stage: hide, reveal, hide again, nested, a symlink refused whole; while paused; through a hibernation', async () => {
    const vm = await createVm();
    await sh(vm, 'mkdir /work && echo answer42 > /work/key && echo grade > /etc/grade.txt && ln -s /grader /trap');
    const seen = 'cat /grader/answer.txt /work/key /etc/grade.txt 2>&1; ls /work 2>&1';
    expect(await sh(vm, seen)).toBe(`${SECRET}\nanswer42\ngrade\nkey\n`);

    const hide = await patch(vm, { hiddenPaths: ['/grader', '/work/', '/etc/grade.txt'] });
    expect(hide.status, JSON.stringify(hide.body)).toBe(200);
    expect(hide.body.spec.hiddenPaths).toEqual(['/grader', '/work', '/etc/grade.txt']);
    const hidden = await sh(vm, `${seen}; umount /work 2>&1; umount -l /work 2>&1; cat /work/key 2>&1; echo x > /work/new 2>&1; true`);
    expect(hidden).not.toContain('answer42');
    expect(hidden).not.toContain('grade\n');
    expect(hidden).not.toContain(SECRET);

    expect((await patch(vm, { hiddenPaths: [] })).status).toBe(200);
    expect(await sh(vm, seen)).toBe(`${SECRET}\nanswer42\ngrade\nkey\n`);
    expect((await patch(vm, { hiddenPaths: ['/grader', '/work'] })).status).toBe(200);
    expect(await sh(vm, seen)).toContain('grade\n');
    expect(await sh(vm, seen)).not.toContain('answer42');

    // A symlink is refused, not followed, and the whole change with it.
    const trap = await patch(vm, { hiddenPaths: ['/etc/grade.txt', '/trap'] });
    expect(trap.status, JSON.stringify(trap.body)).toBe(400);
    expect(trap.body.error.message).toContain('/trap is a symbolic link');
    expect(await sh(vm, seen)).toContain('grade\n');
    expect(await sh(vm, seen)).not.toContain('answer42');
    // Nested: the directory revealed first, then the file inside it hidden.
    expect((await patch(vm, { hiddenPaths: ['/work/key'] })).status).toBe(200);
    expect(await sh(vm, 'ls /work; wc -c < /work/key; cat /grader/answer.txt')).toBe(`key\n0\n${SECRET}\n`);

    // Paused: the stage applies (the VM let run for the guest's side only) and it stays paused.
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${vm}/pause`, {})).body.state).toBe('paused');
    expect((await patch(vm, { hiddenPaths: ['/grader'] })).status).toBe(200);
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${vm}`)).body.state).toBe('paused');
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${vm}/resume`, {})).body.state).toBe('running');
    expect(await sh(vm, seen)).toBe('cat: can\'t open \'/grader/answer.txt\': No such file or directory\nanswer42\ngrade\nkey\n');

    // Hibernated whole, the guest keeps its covers; a stage while hibernated applies at the wake.
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${vm}/pause`, { mode: 'hibernate' })).body.state).toBe('hibernated');
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${vm}/resume`, {})).body.state).toBe('running');
    expect(await sh(vm, 'ls -A /grader | wc -l')).toBe('0\n');
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${vm}/pause`, { mode: 'hibernate' })).body.state).toBe('hibernated');
    expect((await patch(vm, { hiddenPaths: ['/work'] })).status).toBe(200);
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${vm}/resume`, {})).body.state).toBe('running');
    expect(await sh(vm, 'cat /grader/answer.txt; ls -A /work | wc -l')).toBe(`${SECRET}\n0\n`);
    await remove(vm);
  }, 300_000);
  // Hidden paths left out of snapshots, in both tiers: test/tiers-walls.test.ts.
});
