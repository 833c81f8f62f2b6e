import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { qemuPidsUnder } from './support/qemu.ts';

/**
 * Snapshots (pack_diff) of microVMs over the real stack: the guest's trusted side streams
 * its overlay upper dir as a tar over the VM's channel into the host's tar -> EROFS
 * writer (the host never mounts the guest's disk). The snapshot stacks in a container and
 * in a microVM alike; a paused VM is packed as it is; a guest whose stream stops, dies or
 * outgrows its cap gets a coded error, nothing is stored and the VM runs on. Real QEMU
 * (TCG here), gateway, Redis and worker host.
 */
let cluster: TestCluster;
let token: string;
const IDLE_MS = 3000;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-vmsnap', env: { ROLLBOX_VM_SNAPSHOT_IDLE_MS: String(IDLE_MS) } }] });
  token = await cluster.token('vm-snap', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:snapshot']);
}, 60_000);
afterAll(async () => {
  await cluster?.stop();
  expect(qemuPidsUnder(cluster.rootDir)).toEqual([]);
});

const create = async (body: object = {}): Promise<string> => {
  const r = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 256, cpuMillis: 1000, diskMiB: 512 }, ...body });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body.id as string;
};
const createVm = (body: object = {}) => create({ tier: 'microvm', ...body });
const sh = async (id: string, cmd: string, timeoutMs = 60_000): Promise<string> => {
  const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs });
  expect(r.body.exitCode, `${cmd}: ${JSON.stringify(r.body)}`).toBe(0);
  return r.body.stdout as string;
};
const snapshot = (id: string, body: object = {}) => api(cluster, token, 'POST', `/v1/sandboxes/${id}/snapshot`, body);
const remove = (...ids: string[]) => Promise.all(ids.map((id) => api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)));

/** What the writes below leave: every path with its type, mode, owner and, for files, size, link count, mtime and contents. */
const LISTING = `cd / && find root usr/sbin etc/passwd bin/vi 2>/dev/null | sort | while read -r p; do
  if [ -L "$p" ]; then echo "$p L $(readlink "$p") $(stat -c '%u %g' "$p")";
  elif [ -p "$p" ]; then echo "$p P $(stat -c '%a %u %g' "$p")";
  elif [ -d "$p" ]; then echo "$p D $(stat -c '%a %u %g' "$p")";
  else echo "$p F $(stat -c '%a %u %g %s %h %Y' "$p") $(md5sum < "$p" | cut -c1-32)"; fi; done`;

const LONG = 'd'.repeat(120);
/** Created, modified and deleted files, a re-made directory (opaque), hard links, names tar-and-overlay special, 16 MiB of data. */
const WRITES = [
  'echo created > /root/new && ln /root/new /root/hard',
  'echo own > /root/own && chown 1234:5678 /root/own && chmod 4750 /root/own',
  'ln -s ../../../../etc/passwd /root/climb && ln -s /etc/hostname /root/abs',
  'mkfifo /root/fifo && mkdir /root/empty && echo plain > /root/.wh.plain',
  `mkdir -p /root/${LONG}/${LONG} && echo deep > /root/${LONG}/${LONG}/file`,
  'rm /bin/vi && echo modified >> /etc/passwd',
  'rm -rf /usr/sbin && mkdir /usr/sbin && echo only > /usr/sbin/only',
  'mkdir -p /answers && echo 42 > /answers/ref',
  'dd if=/dev/urandom of=/root/big bs=1M count=16 2>/dev/null',
].join(' && ');

describe('microVM snapshots', () => {
  it('pack the writable layer (whiteouts, opaque dirs, links, long names, excluded paths) into a layer a container and a microVM both stack to the same files', async () => {
    const vm = await createVm();
    await sh(vm, WRITES);
    const before = await sh(vm, LISTING);
    expect(before).toContain('root/fifo P');
    expect(before).not.toContain('bin/vi');

    const started = Date.now();
    const snap = await snapshot(vm, { name: 'vm-env', exclude: ['/answers'] });
    const snapMs = Date.now() - started;
    expect(snap.status, JSON.stringify(snap.body)).toBe(201);
    const base = (await api(cluster, token, 'GET', '/v1/layers/busybox')).body;
    expect(snap.body).toMatchObject({ name: 'vm-env', parents: [base.digest] });
    console.log(`microVM snapshot of 16 MiB: ${snapMs} ms through the API`);
    expect(await sh(vm, 'cat /root/new')).toBe('created\n'); // it runs on

    const container = await create({ image: { base: 'busybox', layers: ['vm-env'] } });
    const child = await createVm({ image: { base: 'busybox', layers: ['vm-env'] } });
    for (const id of [container, child]) {
      expect(await sh(id, LISTING)).toBe(before);
      expect(await sh(id, 'ls /usr/sbin; cat /root/.wh.plain; ls /answers 2>&1 || true')).toMatch(/^only\nplain\nls: \/answers: No such file or directory\n$/);
    }
    await remove(vm, container, child);
  }, 300_000);

  it('freeze the VM only while its tree is staged: frozenMs and the gap a ticker sees, beside a container with the same writes', async () => {
    const figures: Record<string, number | string>[] = [];
    for (const tier of ['container', 'microvm'] as const) {
      const id = tier === 'microvm' ? await createVm() : await create();
      await sh(id, 'mkdir /root/files && i=0; while [ $i -lt 500 ]; do echo $i > /root/files/$i; i=$((i+1)); done; dd if=/dev/urandom of=/root/big bs=1M count=16 2>/dev/null');
      // A ticker outside the writable layer: the longest gap between its ticks is at least how long it was frozen.
      const ticker = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd: 'while :; do read -r up idle < /proc/uptime; echo $up >> /dev/shm/ticks; usleep 2000; done', background: true });
      expect(ticker.status).toBeLessThan(300);
      await waitFor('the ticker ticks', async () => Number((await sh(id, 'cat /dev/shm/ticks 2>/dev/null | wc -l')).trim()) > 20);
      const started = Date.now();
      const snap = await snapshot(id, {});
      const snapMs = Date.now() - started;
      expect(snap.status, JSON.stringify(snap.body)).toBe(201);
      // Uptime in centiseconds: gaps to 10 ms.
      const ticks = (await sh(id, 'cat /dev/shm/ticks')).trim().split('\n').map((t) => Number(t) * 1000);
      const gaps = ticks.slice(1).map((t, i) => t - ticks[i]!);
      // Files only: the same pack as the snapshot's (a microVM forks its processes by default: microvm-fork.test.ts).
      const forked = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/fork`, { count: 1, processes: false });
      expect(forked.status, JSON.stringify(forked.body)).toBe(201);
      expect(forked.body.parentFrozenMs).toBeGreaterThan(0);
      const child = forked.body.children[0].id as string;
      expect(await sh(child, 'ls /root/files | wc -l; wc -c < /root/big')).toBe('500\n16777216\n');
      figures.push({ tier, snapshotMs: snapMs, forkFrozenMs: Math.round(forked.body.parentFrozenMs), longestTickGapMs: Math.round(Math.max(...gaps)), medianTickGapMs: Math.round(gaps.sort((a, b) => a - b)[gaps.length >> 1]!) });
      await api(cluster, token, 'POST', `/v1/sandboxes/${id}/commands/${ticker.body.commandId}/signal`, { signal: 'KILL' });
      await remove(id, child);
    }
    console.log(`snapshot of 500 files + 16 MiB: ${JSON.stringify(figures)}`);
  }, 300_000);

  it('pack a paused VM as it is: it stays paused, its processes do not run; hibernated and woken, it runs', async () => {
    const vm = await createVm();
    const counter = await api(cluster, token, 'POST', `/v1/sandboxes/${vm}/exec`, { cmd: 'i=0; while :; do i=$((i+1)); echo $i > /root/count; usleep 20000; done', background: true });
    await waitFor('the counter counts', async () => Number(await sh(vm, 'cat /root/count 2>/dev/null || echo 0')) > 5);
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${vm}/pause`, {})).body.state).toBe('paused');
    const snap = await snapshot(vm, { name: 'vm-paused' });
    expect(snap.status, JSON.stringify(snap.body)).toBe(201);
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${vm}`)).body.state).toBe('paused');
    const resumedAtMs = performance.now();
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${vm}/resume`, {})).body.state).toBe('running');
    const atResume = Number(await sh(vm, 'cat /root/count'));
    const resumeAndReadMs = performance.now() - resumedAtMs;
    // The snapshot holds the count of the pause: the same as right after the resume, give or
    // take the ticks (20 ms each) the guest counted between the resume and the read, however
    // long a loaded TCG guest took for them. A VM running through its pack would be a pack's
    // length ahead. The margin (15 ticks, 0.3 s of the guest's clock) is for a TCG guest on a
    // loaded host: a full CI run once saw 9 ticks counted between a resume and a read 48 ms
    // apart (the guest's clock catching up after its resume, it seems).
    const container = await create({ image: { base: 'busybox', layers: ['vm-paused'] } });
    const packed = Number(await sh(container, 'cat /root/count'));
    expect(atResume - packed).toBeGreaterThanOrEqual(0);
    expect(atResume - packed).toBeLessThan(resumeAndReadMs / 20 + 15);
    await waitFor('the counter counts again', async () => Number(await sh(vm, 'cat /root/count')) > atResume + 3);
    // Paused (frozen in the guest), hibernated whole, woken: it runs again (the restore thaws it). A
    // command still running is refused a whole hibernation: the counter goes on as a detached process.
    await api(cluster, token, 'POST', `/v1/sandboxes/${vm}/commands/${counter.body.commandId}/signal`, { signal: 'KILL' });
    await sh(vm, '(i=0; while :; do i=$((i+1)); echo $i > /root/count; usleep 20000; done) >/dev/null 2>&1 &');
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${vm}/pause`, {})).body.state).toBe('paused');
    const hibernated = await api(cluster, token, 'POST', `/v1/sandboxes/${vm}/pause`, { mode: 'hibernate' });
    expect(hibernated.body.state, JSON.stringify(hibernated.body)).toBe('hibernated');
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${vm}/resume`, {})).body.state).toBe('running');
    const woken = Number(await sh(vm, 'cat /root/count'));
    await waitFor('the counter counts after the wake', async () => Number(await sh(vm, 'cat /root/count')) > woken + 3);
    await remove(vm, container);
  }, 300_000);

  it('give a coded error when the guest\'s stream stops, its packer dies or it outgrows the disk: nothing stored, the VM runs on', async () => {
    const vm = await createVm();
    await sh(vm, 'dd if=/dev/urandom of=/root/big bs=1M count=48 2>/dev/null');
    const layerCount = async () => (await api(cluster, token, 'GET', '/v1/layers')).body.layers.length as number;
    const layersBefore = await layerCount();
    const tmpDir = path.join(cluster.rootDir, 'node-vmsnap', 'worker', 'tmp');
    // Root in the sandbox signals the guest's packer (a child of the multiplexer: comm "init", cgroup "/") once it appears.
    const signalPacker = (signal: string) =>
      api(cluster, token, 'POST', `/v1/sandboxes/${vm}/exec`, {
        cmd: `while :; do for s in /proc/[0-9]*/stat; do read -r pid comm state ppid rest < $s 2>/dev/null || continue; [ "$comm" = "(init)" ] || continue; [ "$(cat /proc/$ppid/cgroup 2>/dev/null)" = "0::/" ] || continue; grep -q "^PPid:.1$" /proc/$ppid/status || continue; kill -${signal} $pid && echo $pid && exit 0; done; done`,
        timeoutMs: 120_000,
      });
    for (const signal of ['STOP', 'KILL']) {
      const signalled = signalPacker(signal);
      const started = Date.now();
      const failed = await snapshot(vm, {});
      const packer = (await signalled).body.stdout.trim();
      expect(packer, JSON.stringify((await signalled).body)).toMatch(/^\d+$/);
      expect(failed.status, JSON.stringify(failed.body)).toBe(502);
      expect(failed.body.error.code).toBe('snapshot_failed');
      console.log(`packer ${signal}ed: ${failed.body.error.message} (${Date.now() - started} ms)`);
      expect(await sh(vm, `[ -e /proc/${packer} ] && echo left || echo gone`)).toBe('gone\n');
    }
    // Sparse: its 8 GiB of zeros would be streamed; the host stops at the disk's size.
    await sh(vm, 'truncate -s 8G /root/sparse');
    const tooBig = await snapshot(vm, {});
    expect(tooBig.status, JSON.stringify(tooBig.body)).toBe(413);
    expect(tooBig.body.error.code).toBe('payload_too_large');
    expect(await layerCount()).toBe(layersBefore);
    expect(fs.readdirSync(tmpDir).filter((f) => f.startsWith('pack-'))).toEqual([]);
    // Not frozen, and a snapshot works again.
    expect(await sh(vm, 'rm /root/sparse; echo alive')).toBe('alive\n');
    expect((await snapshot(vm, {})).status).toBe(201);
    expect(await layerCount()).toBe(layersBefore + 1);
    await remove(vm);
  }, 300_000);
});
