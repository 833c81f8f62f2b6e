import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { discoverCgroups } from '../src/workers/runtime/cgroups.ts';
import { BESTEFFORT_ROOT } from '../src/workers/runtime/index.ts';
import { VMM_OVERHEAD_MIB, VMM_PIDS, vmCgroupRel } from '../src/workers/microvm/cgroup.ts';
import { api, startTestCluster, type TestCluster } from './support/cluster.ts';
import { qemuPidsUnder } from './support/qemu.ts';

/**
 * The VMM in the sandbox's host cgroup: QEMU's pid in a cgroup of its own with the CPU
 * quota from cpuMillis, memory = guest RAM + the measured VMM overhead, a pids limit; for
 * besteffort, SCHED_IDLE and the idle tree. Also the measurement behind VMM_OVERHEAD_MIB:
 * the cgroup's peak with the guest's RAM touched, which must stay under the limit.
 */
const NODE = 'node-vmcg';
let cluster: TestCluster;
let token: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: NODE }] });
  token = await cluster.token('vmcg-team', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
}, 60_000);
afterAll(async () => {
  await cluster?.stop();
  expect(qemuPidsUnder(cluster.rootDir)).toEqual([]);
  const h = await discoverCgroups();
  for (const root of [h.memory, h.pids, h.cpu!]) for (const tree of ['rollbox-vm', 'rollbox-vm-besteffort']) expect(fs.existsSync(path.join(root, tree, NODE))).toBe(false);
}, 60_000);

const read = (file: string) => fs.readFileSync(file, 'utf8').trim();
const createVm = async (body: object) => {
  const created = await api(cluster, token, 'POST', '/v1/sandboxes', { tier: 'microvm', ...body });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  return created.body.id as string;
};
const vmPid = (id: string) => Number(JSON.parse(read(path.join(cluster.rootDir, NODE, 'worker', 'microvm', id, 'vm.json'))).pid);
/** SCHED_IDLE is policy 5 (field 41 of /proc/PID/task/TID/stat). */
const policies = (pid: number) => fs.readdirSync(`/proc/${pid}/task`).map((tid) => Number(read(`/proc/${pid}/task/${tid}/stat`).replace(/^.*\) /, '').split(' ')[38]));

describe('the VMM in the sandbox\'s host cgroup', () => {
  it('latency: QEMU in its cgroup with the quota, memory and pids limits; guest RAM touched stays under the limit', async () => {
    const memoryMiB = 256;
    const id = await createVm({ resources: { memoryMiB, cpuMillis: 1500 } });
    const pid = vmPid(id);
    const h = await discoverCgroups();
    const rel = vmCgroupRel(NODE, id, 'latency');
    expect(read(`/proc/${pid}/cgroup`)).toContain(`/${rel}`);
    for (const root of [h.memory, h.pids, h.cpu!]) expect(read(path.join(root, rel, 'cgroup.procs')).split('\n').map(Number)).toContain(pid);
    expect(read(path.join(h.cpu!, rel, 'cpu.cfs_quota_us'))).toBe('150000');
    expect(read(path.join(h.cpu!, rel, 'cpu.cfs_period_us'))).toBe('100000');
    expect(read(path.join(h.cpu!, rel, 'cpu.shares'))).toBe(String(Math.round(1.5 * 1024)));
    const limit = (memoryMiB + VMM_OVERHEAD_MIB) * 1024 * 1024;
    expect(Number(read(path.join(h.memory, rel, 'memory.limit_in_bytes')))).toBe(limit);
    expect(read(path.join(h.pids, rel, 'pids.max'))).toBe(String(VMM_PIDS + 2));
    expect(policies(pid).every((p) => p === 0)).toBe(true);

    // Touch (nearly) all of the guest's RAM: an anonymous 200 MiB buffer, then page cache.
    const touched = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd: 'dd if=/dev/zero of=/dev/null bs=200M count=1 2>&1; dd if=/dev/zero of=/root/fill bs=1M count=300 2>&1 | tail -n 1; sync; echo done', timeoutMs: 120_000 });
    expect(touched.body.stdout, JSON.stringify(touched.body)).toContain('done');
    const mib = (n: number) => Math.round(n / 1024 / 1024);
    const peak = Number(read(path.join(h.memory, rel, 'memory.max_usage_in_bytes')));
    const stat = Object.fromEntries(read(path.join(h.memory, rel, 'memory.stat')).split('\n').map((l) => l.split(' ')).map(([k, v]) => [k, Number(v)]));
    const status = read(`/proc/${pid}/status`);
    const hwm = Number(/VmHWM:\s+(\d+) kB/.exec(status)![1]) * 1024;
    const threads = Number(/Threads:\s+(\d+)/.exec(status)![1]);
    console.log(`VMM cgroup (${memoryMiB} MiB guest): peak ${mib(peak)} MiB of ${mib(limit)} MiB; rss ${mib(stat.rss!)} MiB, cache ${mib(stat.cache!)} MiB; QEMU VmHWM ${mib(hwm)} MiB (overhead over the guest's RAM ${mib(hwm) - memoryMiB} MiB); threads ${threads}; failcnt ${read(path.join(h.memory, rel, 'memory.failcnt'))}`);
    // QEMU itself never needed more than the limit: its resident peak is under it, and it still runs.
    expect(hwm).toBeLessThan(limit);
    expect(threads).toBeLessThanOrEqual(VMM_PIDS + 2);
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { argv: ['true'] })).body.exitCode).toBe(0);
    expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)).status).toBe(200);
    for (const root of [h.memory, h.pids, h.cpu!]) expect(fs.existsSync(path.join(root, rel))).toBe(false);
  }, 240_000);

  it('besteffort at 100 millicores: boots at a full CPU, then its own quota; every QEMU thread under SCHED_IDLE, in the idle tree, shares 2', async () => {
    const started = Date.now();
    const id = await createVm({ resources: { memoryMiB: 192, cpuMillis: 100 }, class: 'besteffort' });
    console.log(`besteffort 100 millicore VM created in ${Date.now() - started} ms`);
    const pid = vmPid(id);
    const h = await discoverCgroups();
    const rel = vmCgroupRel(NODE, id, 'besteffort');
    expect(read(`/proc/${pid}/cgroup`)).toContain(`/${rel}`);
    expect(policies(pid).every((p) => p === 5), String(policies(pid))).toBe(true);
    expect(read(path.join(h.cpu!, rel, 'cpu.cfs_quota_us'))).toBe('10000');
    expect(read(path.join(h.cpu!, rel, 'cpu.shares'))).toBe('2');
    if (fs.existsSync(path.join(h.cpu!, 'rollbox-vm-besteffort', 'cpu.idle'))) expect(read(path.join(h.cpu!, 'rollbox-vm-besteffort', 'cpu.idle'))).toBe('1');
    let t = Date.now();
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { argv: ['echo', 'idle'] })).body.stdout).toBe('idle\n');
    console.log(`exec at 100 millicores: ${Date.now() - t} ms`);
    // The quota holds: a busy loop in the guest gets about a tenth of a CPU on the host.
    // utime + stime of QEMU, in clock ticks (USER_HZ 100): ns.
    const usage = () => read(`/proc/${pid}/stat`).replace(/^.*\) /, '').split(' ').slice(11, 13).reduce((a, b) => a + Number(b), 0) * 1e7;
    const before = usage();
    t = Date.now();
    await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd: 'timeout 1 sh -c "while :; do :; done"; true', timeoutMs: 30_000 });
    const cores = (usage() - before) / 1e6 / (Date.now() - t);
    console.log(`guest busy loop: QEMU used ${cores.toFixed(3)} cores over ${Date.now() - t} ms`);
    expect(cores).toBeLessThan(0.2);
    expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)).status).toBe(200);
    expect(fs.existsSync(path.join(h.cpu!, rel))).toBe(false);
  }, 120_000);

  it('one besteffort guard for both tiers: a latency container\'s waited-on command holds a besteffort VM back, a latency VM\'s holds a besteffort container', async () => {
    const h = await discoverCgroups();
    const vm = await createVm({ resources: { memoryMiB: 192, cpuMillis: 200 }, class: 'besteffort' });
    const vmQuota = path.join(h.cpu!, vmCgroupRel(NODE, vm, 'besteffort'), 'cpu.cfs_quota_us');
    const latency = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 } });
    expect(latency.status, JSON.stringify(latency.body)).toBe(201);
    /** The quota files' values while a command of `holder` sleeps 2 s, and after. */
    const during = async (holder: string, files: string[]): Promise<{ held: string[]; after: string[] }> => {
      const running = api(cluster, token, 'POST', `/v1/sandboxes/${holder}/exec`, { cmd: 'sleep 2', timeoutMs: 60_000 });
      await new Promise((r) => setTimeout(r, 1000));
      const held = files.map(read);
      expect((await running).body.exitCode).toBe(0);
      return { held, after: files.map(read) };
    };
    expect(await during(latency.body.id, [vmQuota])).toEqual({ held: ['1000'], after: ['20000'] });

    const latencyVm = await createVm({ resources: { memoryMiB: 192, cpuMillis: 1000 } });
    const besteffort = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64, cpuMillis: 300 }, class: 'besteffort' });
    expect(besteffort.status, JSON.stringify(besteffort.body)).toBe(201);
    const containerQuota = path.join(h.cpu!, BESTEFFORT_ROOT, NODE, `rb-${besteffort.body.id}`, 'cpu.cfs_quota_us');
    expect(await during(latencyVm, [containerQuota, vmQuota])).toEqual({ held: ['1000', '1000'], after: ['30000', '20000'] });
    for (const id of [vm, latency.body.id, latencyVm, besteffort.body.id]) expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)).status).toBe(200);
  }, 180_000);

  it('pids inside the guest: a fork flood stops at the limit, the sandbox recovers', async () => {
    const id = await createVm({ resources: { memoryMiB: 192, cpuMillis: 1000, pids: 24 } });
    const exec = (cmd: string) => api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs: 60_000 });
    // The command's own exec cgroup, under the sandbox's (its pids limit counts every one).
    expect((await exec('cat /proc/self/cgroup')).body.stdout).toMatch(/^0::\/sandbox\/a\d+\n$/);
    // Root in the guest cannot reach the cgroup to raise its limit: no mount of it, none allowed.
    expect((await exec('grep -c cgroup /proc/self/mounts; mount -t cgroup2 none /mnt 2>/dev/null && echo MOUNTED || echo REFUSED')).body.stdout).toBe('0\nREFUSED\n');
    // Background sleeps until fork fails (that shell then gives up); counted and killed by
    // the outer shell with builtins only (no fork needed at the limit).
    const flood = await exec([
      "sh -c 'for i in $(seq 60); do sleep 60 </dev/null >/dev/null 2>&1 & done' 2>/dev/null",
      'n=0; p=""; for d in /proc/[0-9]*; do read c < $d/comm 2>/dev/null; [ "$c" = sleep ] && n=$((n+1)) && p="$p ${d#/proc/}"; done',
      'echo "alive=$n"; kill $p; true',
    ].join('; '));
    const alive = Number(/alive=(\d+)/.exec(flood.body.stdout ?? '')?.[1]);
    console.log(`guest pids limit 24: ${alive} of 60 background processes started; ${JSON.stringify(flood.body.stderr).slice(0, 120)}`);
    expect(alive).toBeGreaterThan(5);
    expect(alive).toBeLessThan(24);
    expect((await exec('echo recovered')).body.stdout).toBe('recovered\n');
    expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)).status).toBe(200);
  }, 120_000);
});
