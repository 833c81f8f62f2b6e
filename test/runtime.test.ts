import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, readFileSync, readdirSync, statSync, statfsSync, writeFileSync } from 'node:fs';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RollboxError } from '../src/api/index.ts';
import { LayerMounts, LayerStore, buildBusyboxBase, buildLayerFromTar, readMountInfo, type LayerFiles } from '../src/layers/index.ts';
import { BESTEFFORT_ROOT, createRuncRuntime, type RuncRuntime } from '../src/workers/runtime/index.ts';
import type { RuntimeExecSpec, SandboxRuntimeSpec } from '../src/workers/runtime/types.ts';
import { tarOf } from './support/tar.ts';

let top: string;
let dataDir: string;
let store: LayerStore;
let base: LayerFiles;
let extra: LayerFiles;
let cgroupRoots: string[];
const nodeId = `t${randomBytes(4).toString('hex')}`;
const runtimes: RuncRuntime[] = [];
const SCRATCH_GIB = 4;
const MIB = 1024 * 1024;

function newRuntime(options: { besteffortHoldMs?: number } = {}): RuncRuntime {
  const layerMounts = new LayerMounts({ dataDir, storeDir: store.dir });
  // A small scratch filesystem, so the "does not fit" case is cheap to reach.
  const rt = createRuncRuntime({ dataDir, nodeId, layerMounts, scratchSizeGiB: SCRATCH_GIB, preallocateDisks: true, ...options });
  runtimes.push(rt);
  return rt;
}

function spec(sandboxId: string, over: Partial<SandboxRuntimeSpec> = {}): SandboxRuntimeSpec {
  return {
    sandboxId,
    layerImages: [base],
    resources: { cpuMillis: 1000, memoryMiB: 64, diskMiB: 256, pids: 64 },
    class: 'latency',
    env: { GREETING: 'hello' },
    workdir: '/work',
    hiddenPaths: [],
    ...over,
  };
}

function cmd(script: string, over: Partial<RuntimeExecSpec> = {}): RuntimeExecSpec {
  return { argv: ['sh', '-c', script], env: {}, timeoutMs: 10_000, outputCapBytes: 64 * 1024, ...over };
}

function sha256Hex(file: string): string {
  return createHash('sha256').update(readFileSync(file)).digest('hex');
}


const mountsUnderTop = (): string[] =>
  readFileSync('/proc/self/mounts', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[1] ?? '')
    .filter((mp) => mp.startsWith(`${top}/`));
/** Mounts under top other than the scratch filesystem and sandbox disks (layers, overlays). */
const layerMountsUnderTop = (): string[] => mountsUnderTop().filter((m) => !m.endsWith('/scratch') && !m.endsWith('/disk'));
const loopsOf = (imagePath: string): string => execFileSync('losetup', ['-j', imagePath], { encoding: 'utf8' }).trim();
/** Every loop device whose backing file is under top (layers, scratch, sandbox disks). */
const loopsUnderTop = (): string[] =>
  execFileSync('losetup', ['-a', '-n', '-O', 'NAME,BACK-FILE'], { encoding: 'utf8' })
    .split('\n')
    .filter((l) => l.includes(`${top}/`));

/**
 * The kernel detaches an autoclear loop device only once the last opener is gone, which
 * after an unmount happens asynchronously: wait (up to 5 s) for the list to empty.
 */
async function loopsAfterRelease<T extends string | string[]>(read: () => T): Promise<T> {
  for (let i = 0; i < 50 && read().length > 0; i++) await new Promise((r) => setTimeout(r, 100));
  return read();
}

const cgroupDirsOf = (sandboxId: string): string[] =>
  cgroupRoots.flatMap((r) => ['rollbox', BESTEFFORT_ROOT].map((top) => path.join(r, top, nodeId, `rb-${sandboxId}`))).filter((d) => existsSync(d));
const runcList = (rt: RuncRuntime): string[] => readdirSync(rt.runcRoot).filter((n) => n.startsWith('rb-'));

/** Everything a removed sandbox must not leave behind. */
function expectGone(rt: RuncRuntime, sandboxId: string): void {
  expect(runcList(rt)).not.toContain(`rb-${sandboxId}`);
  expect(existsSync(path.join(rt.sandboxesDir, sandboxId))).toBe(false);
  expect(cgroupDirsOf(sandboxId)).toEqual([]);
  expect(mountsUnderTop().filter((m) => m.includes(`/sandboxes/${sandboxId}`))).toEqual([]);
  expect(existsSync(path.join(rt.scratchDir, 'disks', `${sandboxId}.img`))).toBe(false);
}

beforeAll(async () => {
  top = await mkdtemp(path.join(os.tmpdir(), 'rollbox-runtime-'));
  dataDir = path.join(top, 'node');
  store = new LayerStore(path.join(top, 'store'));
  const tmpDir = path.join(top, 'tmp');
  await mkdir(tmpDir, { recursive: true });
  base = (await buildBusyboxBase({ store, tmpDir })).files;
  extra = (
    await buildLayerFromTar(
    Readable.from(
      await tarOf([
        { name: 'opt/tool/', type: 'directory', mode: 0o755 },
        { name: 'opt/tool/VERSION', type: 'file', content: '1.2.3\n' },
        { name: 'etc/motd', type: 'file', content: 'from the extra layer\n' },
      ], { mtime: new Date(0) }),
    ),
      { store, tmpDir, maxBytes: 1 << 20 },
    )
  ).files;
  cgroupRoots = (await readMountInfo()).filter((m) => m.fsType === 'cgroup' || m.fsType === 'cgroup2').map((m) => m.mountPoint);
});

afterAll(async () => {
  // The last runtime instance cleans everything this node id owns, whatever the tests did.
  const rt = runtimes.at(-1) ?? (store ? newRuntime() : undefined);
  await rt?.reconcile(new Set()).catch((err: unknown) => console.error('final reconcile failed', err));
  for (const mp of top ? mountsUnderTop().reverse() : []) execFileSync('umount', ['-l', mp]);
  if (top) await rm(top, { recursive: true, force: true });
});

describe('runc runtime', () => {
  it('creates, runs commands that share a filesystem, and destroys without leftovers', async () => {
    const rt = newRuntime();
    await rt.create(spec('life', { hiddenPaths: ['/etc/hosts'] }));
    await rt.create(spec('life')); // a retried create is a no-op
    expect(await rt.isRunning('life')).toBe(true);
    expect(rt.mountedLayers()).toEqual([base.digest]);

    const echo = await rt.exec('life', { argv: ['echo', 'hi', 'there'], env: {}, timeoutMs: 5000, outputCapBytes: 1024 });
    expect(echo).toMatchObject({ exitCode: 0, stdout: 'hi there\n', stderr: '', truncated: false, timedOut: false, oomKilled: false });
    expect(echo.durationMs).toBeGreaterThan(0);

    expect((await rt.exec('life', cmd('echo "$GREETING $EXTRA" > note.txt', { env: { EXTRA: 'world' } }))).exitCode).toBe(0);
    const read = await rt.exec('life', cmd('pwd; cat /work/note.txt; cat -; exit 3', { stdin: 'from stdin' }));
    expect(read).toMatchObject({ exitCode: 3, stdout: '/work\nhello world\nfrom stdin' });
    expect((await rt.exec('life', cmd('pwd', { cwd: '/tmp' }))).stdout).toBe('/tmp\n');
    expect((await rt.exec('life', cmd('echo oops >&2; false'))).stderr).toBe('oops\n');

    // Namespaces: own pid 1 (rollbox-init), loopback only and up, hidden path empty.
    const env = await rt.exec('life', cmd('cat /proc/1/cmdline | tr "\\0" " "; echo; ls /sys/class/net; ip link show lo; wc -c < /etc/hosts'));
    expect(env.stdout).toMatch(/^\/\.rollbox\/init \n/);
    expect(env.stdout).toContain('lo\n');
    expect(env.stdout).not.toMatch(/eth|veth/);
    expect(env.stdout).toMatch(/lo: <LOOPBACK,UP/);
    expect(env.stdout.trim().endsWith('0')).toBe(true);

    // Hardening: no new privileges, Docker's capability set, seccomp deny-list (no user namespaces).
    const hard = await rt.exec('life', cmd('grep -E "^(NoNewPrivs|Seccomp|CapBnd):" /proc/self/status; unshare -U true || echo no-userns'));
    expect(hard.stdout).toMatch(/NoNewPrivs:\s+1/);
    expect(hard.stdout).toMatch(/Seccomp:\s+2/);
    expect(hard.stdout).toMatch(/CapBnd:\s+00000000a80425fb/);
    expect(hard.stdout).toContain('no-userns');

    const big = await rt.exec('life', cmd('head -c 100000 /dev/zero | tr "\\0" a; echo done >&2', { outputCapBytes: 1000 }));
    expect(big.stdout).toHaveLength(1000);
    expect(big.truncated).toBe(true);
    expect(big.stderr).toBe('done\n');
    expect(big.exitCode).toBe(0);

    // A request too large for one message to the slot's keeper travels through a memfd.
    const bigArg = 'x'.repeat(120_000);
    const big2 = await rt.exec('life', { argv: ['sh', '-c', 'printf %s "$1" | wc -c; wc -c', 'sh', bigArg], stdin: 'y'.repeat(3_000_000), env: { LONG: 'z'.repeat(50_000) }, timeoutMs: 10_000, outputCapBytes: 1024 });
    expect(big2, big2.stderr).toMatchObject({ exitCode: 0, stdout: '120000\n3000000\n' });

    const missing = await rt.exec('life', { argv: ['no-such-tool'], env: {}, timeoutMs: 5000, outputCapBytes: 1024 });
    expect(missing.exitCode).toBe(127);
    expect(missing.stderr).toMatch(/^rollbox: cannot start command: .*no-such-tool.*not found/);
    await expect(rt.exec('life', cmd('true', { env: { 'BAD=NAME': 'x' } }))).rejects.toMatchObject({ code: 'invalid_request' });
    await expect(rt.exec('life', cmd('true', { cwd: 'relative' }))).rejects.toMatchObject({ code: 'invalid_request' });

    await rt.destroy('life');
    await rt.destroy('life'); // idempotent
    expect(await rt.isRunning('life')).toBe(false);
    expectGone(rt, 'life');
    expect(rt.mountedLayers()).toEqual([]);
    // The last disk took the scratch filesystem with it; its image stays for the next sandbox.
    expect(mountsUnderTop()).toEqual([]);
    expect(await loopsAfterRelease(loopsUnderTop)).toEqual([]);
    const scratchImage = path.join(dataDir, 'scratch.img');
    expect(existsSync(scratchImage)).toBe(true);
    // The next sandbox mounts that same image again rather than formatting a new one.
    const inode = statSync(scratchImage).ino;
    await rt.create(spec('life2'));
    expect(statSync(scratchImage).ino).toBe(inode);
    expect(mountsUnderTop()).toContain(rt.scratchDir);
    await rt.destroy('life2');
    expect(mountsUnderTop()).toEqual([]);
    expect(await loopsAfterRelease(() => loopsOf(base.imagePath))).toBe('');
    await expect(rt.exec('life', cmd('true'))).rejects.toMatchObject({ code: 'not_found' });
    await expect(rt.create(spec('../evil'))).rejects.toBeInstanceOf(RollboxError);
  });

  it('isolates writes between two sandboxes sharing layers and never changes a layer', async () => {
    const rt = newRuntime();
    const before = [base.imagePath, base.blobPath!, extra.imagePath, extra.blobPath!].map(sha256Hex);
    const layers = { layerImages: [base, extra] };
    await Promise.all([rt.create(spec('share-a', layers)), rt.create(spec('share-b', layers))]);
    // One mount per layer for both sandboxes.
    expect(rt.mountedLayers().sort()).toEqual([base.digest, extra.digest].sort());
    expect(layerMountsUnderTop()).toHaveLength(2);

    const a = await rt.exec('share-a', cmd('cat /opt/tool/VERSION; echo changed > /etc/motd; rm /bin/ls; echo new > /opt/tool/new; cat /etc/motd'));
    expect(a.stdout).toBe('1.2.3\nchanged\n');
    const b = await rt.exec('share-b', cmd('cat /etc/motd; ls /opt/tool; test -e /bin/ls && echo has-ls'));
    expect(b.stdout).toBe('from the extra layer\nVERSION\nhas-ls\n');
    expect([base.imagePath, base.blobPath!, extra.imagePath, extra.blobPath!].map(sha256Hex)).toEqual(before);

    await rt.destroy('share-a');
    expect(rt.mountedLayers().sort()).toEqual([base.digest, extra.digest].sort()); // b still uses them
    expect((await rt.exec('share-b', cmd('cat /opt/tool/VERSION'))).stdout).toBe('1.2.3\n');
    await rt.destroy('share-b');
    expect(rt.mountedLayers()).toEqual([]);
    expect(await loopsAfterRelease(() => loopsOf(base.imagePath))).toBe('');
    expect(await loopsAfterRelease(() => loopsOf(extra.imagePath))).toBe('');
  });

  it('runs besteffort sandboxes under SCHED_IDLE with minimal CPU weight', async () => {
    const rt = newRuntime();
    await rt.create(spec('idle', { class: 'besteffort', resources: { cpuMillis: 250, memoryMiB: 64, diskMiB: 64, pids: 64 } }));
    // Field 41 of /proc/self/stat is the scheduling policy: 5 = SCHED_IDLE.
    const r = await rt.exec('idle', cmd('cut -d" " -f41 /proc/self/stat; cat /proc/self/oom_score_adj /proc/1/oom_score_adj'));
    expect(r.stdout).toBe('5\n500\n0\n');
    const cpu = cgroupRoots.find((c) => c.endsWith('/cpu'))!;
    // Its own idle tree next to the host's tasks, not under rollbox/ (see besteffortParent).
    expect(readFileSync(path.join(cpu, BESTEFFORT_ROOT, 'cpu.idle'), 'utf8').trim()).toBe('1');
    expect(existsSync(path.join(cpu, 'rollbox', nodeId, 'rb-idle'))).toBe(false);
    // shares 2 as configured; with cpu.idle set the group reads the idle weight, 3.
    expect(readFileSync(path.join(cpu, BESTEFFORT_ROOT, nodeId, 'rb-idle', 'cpu.shares'), 'utf8').trim()).toBe('3');
    expect(readFileSync(path.join(cpu, BESTEFFORT_ROOT, nodeId, 'rb-idle', 'cpu.idle'), 'utf8').trim()).toBe('1');
    expect(readFileSync(path.join(cpu, BESTEFFORT_ROOT, nodeId, 'rb-idle', 'cpu.cfs_quota_us'), 'utf8').trim()).toBe('25000');
    await rt.destroy('idle');
    expectGone(rt, 'idle');
  });

  it('holds besteffort sandboxes at the minimal CPU quota while a waited-on latency command runs, at most besteffortHoldMs', async () => {
    const rt = newRuntime({ besteffortHoldMs: 4000 });
    await rt.create(spec('held', { class: 'besteffort', resources: { cpuMillis: 500, memoryMiB: 64, diskMiB: 64, pids: 64 } }));
    await rt.create(spec('holder'));
    const cpu = cgroupRoots.find((c) => c.endsWith('/cpu'))!;
    const quota = () => readFileSync(path.join(cpu, BESTEFFORT_ROOT, nodeId, 'rb-held', 'cpu.cfs_quota_us'), 'utf8').trim();
    const until = async (what: string, ok: () => boolean) => {
      for (let i = 0; i < 200 && !ok(); i++) await new Promise((r) => setTimeout(r, 20));
      expect(ok(), what).toBe(true);
    };
    /** Every quota the besteffort sandbox had while the command ran. */
    const quotasDuring = async (run: Promise<unknown>) => {
      const seen = new Set<string>();
      let done = false;
      void run.finally(() => (done = true));
      while (!done) {
        seen.add(quota());
        await new Promise((r) => setTimeout(r, 20));
      }
      await run;
      return [...seen];
    };
    expect(quota()).toBe('50000');
    // Held back (the kernel's smallest quota) while it runs, given back after; a besteffort
    // sandbox that starts meanwhile is held back too.
    const lateQuota = () => readFileSync(path.join(cpu, BESTEFFORT_ROOT, nodeId, 'rb-late', 'cpu.cfs_quota_us'), 'utf8').trim();
    const held = rt.exec('holder', cmd('sleep 3', { holdBackBesteffort: true }));
    await until('held back', () => quota() === '1000');
    await rt.create(spec('late', { class: 'besteffort', resources: { cpuMillis: 250, memoryMiB: 64, diskMiB: 64, pids: 64 } }));
    expect(lateQuota()).toBe('1000');
    await held;
    expect([quota(), lateQuota()]).toEqual(['50000', '25000']);
    await rt.destroy('late');
    // Not by a command nobody waits on, nor by a besteffort sandbox's own command.
    expect(await quotasDuring(rt.exec('holder', cmd('sleep 0.5')))).toEqual(['50000']);
    expect(await quotasDuring(rt.exec('held', cmd('sleep 0.5', { holdBackBesteffort: true })))).toEqual(['50000']);
    // A long command gives the CPU back after besteffortHoldMs, while it still runs.
    let longDone = false;
    const long = rt.exec('holder', cmd('sleep 7', { holdBackBesteffort: true, timeoutMs: 20_000 })).finally(() => (longDone = true));
    await until('held back', () => quota() === '1000');
    await until('given back after the hold', () => quota() === '50000');
    expect(longDone).toBe(false);
    await long;
    // A worker that died while holding leaves the cap behind: adoption gives the quota back.
    writeFileSync(path.join(cpu, BESTEFFORT_ROOT, nodeId, 'rb-held', 'cpu.cfs_quota_us'), '1000');
    const next = newRuntime();
    expect((await next.reconcile(new Set(['held', 'holder']))).adopted.sort()).toEqual(['held', 'holder']);
    expect(quota()).toBe('50000');
    await next.destroy('held');
    await next.destroy('holder');
    expectGone(next, 'held');
  });

  it('OOM-kills a memory balloon past memoryMiB and the sandbox keeps answering', async () => {
    const rt = newRuntime();
    await rt.create(spec('oom', { resources: { cpuMillis: 1000, memoryMiB: 32, diskMiB: 64, pids: 64 } }));
    expect(await rt.oomKillCount('oom')).toBe(0);
    // busybox tail keeps the unterminated "line" it reads from /dev/zero: it grows until the
    // memory cgroup's OOM killer takes it (a shell pipeline can lose its shell too, which
    // the killer may pick second while the first victim's memory is being freed).
    // A command beside it in the same sandbox is not told of an OOM kill it did not suffer.
    const [balloon, beside] = await Promise.all([
      rt.exec('oom', { argv: ['tail', '/dev/zero'], env: {}, timeoutMs: 20_000, outputCapBytes: 1024 }),
      rt.exec('oom', cmd('sleep 1; echo beside')),
    ]);
    expect(balloon).toMatchObject({ oomKilled: true, exitCode: 137, timedOut: false });
    expect(balloon.oomKills).toBeGreaterThanOrEqual(1);
    expect(beside).toMatchObject({ oomKilled: false, oomKills: 0, exitCode: 0, stdout: 'beside\n' });
    // Counted in the command's own exec cgroup, not the sandbox's (its init was not touched).
    expect(await rt.oomKillCount('oom')).toBe(0);
    expect(await rt.isRunning('oom')).toBe(true);
    const after = await rt.exec('oom', cmd('echo alive'));
    expect(after).toMatchObject({ exitCode: 0, stdout: 'alive\n', oomKilled: false });
    await rt.destroy('oom');
    expectGone(rt, 'oom');
  });

  it('stops a fork bomb at the pids limit while a neighbour answers', async () => {
    const rt = newRuntime();
    const small = { resources: { cpuMillis: 500, memoryMiB: 64, diskMiB: 64, pids: 32 } };
    await Promise.all([rt.create(spec('bomb', small)), rt.create(spec('calm'))]);
    // ash exits when a fork fails, so this bomb's population churns at the limit (and could
    // even die out); what matters is that the kernel refused forks at the limit. (v1 counts
    // pids.events in the forking task's cgroup, the per-exec one, so we check stderr.)
    const pidsDir = path.join(cgroupRoots.find((r) => r.endsWith('/pids'))!, 'rollbox', nodeId, 'rb-bomb');
    const bomb = rt.exec('bomb', cmd('b() { while :; do b & done; }; b', { timeoutMs: 2000, outputCapBytes: 512 }));
    let maxPids = 0;
    for (let i = 0; i < 12; i++) {
      await new Promise((r) => setTimeout(r, 50));
      maxPids = Math.max(maxPids, Number(readFileSync(path.join(pidsDir, 'pids.current'), 'utf8')));
    }
    expect(maxPids).toBeLessThanOrEqual(32);
    const neighbour = await rt.exec('calm', cmd('echo fine'));
    expect(neighbour).toMatchObject({ exitCode: 0, stdout: 'fine\n' });
    const result = await bomb;
    expect(result.stderr).toMatch(/can't fork: Resource temporarily unavailable/); // refused at the limit
    // Everything the bomb started goes (the last ones may still be exiting); the init
    // survived, and its slot's keeper too unless the timeout killed the slot.
    const pidsNow = () => Number(readFileSync(path.join(pidsDir, 'pids.current'), 'utf8'));
    for (let i = 0; i < 50 && pidsNow() > 2; i++) await new Promise((r) => setTimeout(r, 100));
    expect(pidsNow()).toBeLessThanOrEqual(2);
    expect((await rt.exec('bomb', cmd('echo survived'))).stdout).toBe('survived\n');
    await Promise.all([rt.destroy('bomb'), rt.destroy('calm')]);
    expectGone(rt, 'bomb');
  });

  it('timeout kills a command and its backgrounded children; detached daemons outlive their exec', async () => {
    const rt = newRuntime();
    await rt.create(spec('tmo'));
    const r = await rt.exec('tmo', cmd('sleep 1000 & sleep 1000', { timeoutMs: 300 }));
    expect(r.timedOut).toBe(true);
    expect((await rt.exec('tmo', cmd('ps -o args'))).stdout).not.toContain('sleep 1000');
    // A timeout shorter than runc's own start-up still kills the command once it starts.
    const early = await rt.exec('tmo', { argv: ['sleep', '30'], env: {}, timeoutMs: 1, outputCapBytes: 1024 });
    expect(early.timedOut).toBe(true);
    expect((await rt.exec('tmo', cmd('ps -o args'))).stdout).not.toContain('sleep 30');

    // A daemon whose output is detached is not part of the exec's result and keeps running.
    const d = await rt.exec('tmo', cmd('sleep 999 >/dev/null 2>&1 &', { timeoutMs: 5000 }));
    expect(d).toMatchObject({ exitCode: 0, timedOut: false });
    expect((await rt.exec('tmo', cmd('ps -o args'))).stdout).toContain('sleep 999');
    // The daemon stays in its exec cgroup, which is not handed out again while it lives
    // there: the next command runs in another one, and a timeout there spares the daemon.
    const cgroupOf = 'grep pids /proc/self/cgroup; for p in /proc/[0-9]*; do tr "\\0" " " < $p/cmdline 2>/dev/null | grep -q "^sleep 999" && grep pids $p/cgroup; done';
    const [own, daemon] = (await rt.exec('tmo', cmd(cgroupOf))).stdout.trim().split('\n');
    expect(own).toMatch(/:pids:\/s\d+$/);
    expect(daemon).toMatch(/:pids:\/s\d+$/);
    expect(own).not.toBe(daemon);
    expect((await rt.exec('tmo', cmd('sleep 100', { timeoutMs: 200 }))).timedOut).toBe(true);
    expect((await rt.exec('tmo', cmd('ps -o args'))).stdout).toContain('sleep 999');
    for (const dir of cgroupDirsOf('tmo')) {
      for (const slot of readdirSync(dir, { withFileTypes: true }).filter((e) => e.isDirectory())) expect(slot.name).toMatch(/^s\d+$/);
    }
    await rt.destroy('tmo');
    expectGone(rt, 'tmo');
  });

  it('caps the writable layer at diskMiB with ENOSPC while a neighbour keeps writing; space is reusable', async () => {
    const rt = newRuntime();
    const small = { resources: { cpuMillis: 1000, memoryMiB: 64, diskMiB: 16, pids: 64 } };
    await Promise.all([rt.create(spec('full', small)), rt.create(spec('roomy'))]);

    // The sandbox sees a filesystem of its own size...
    const df = await rt.exec('full', cmd('df -k / | tail -1'));
    const totalKiB = Number(df.stdout.trim().split(/\s+/)[1]);
    expect(totalKiB).toBeGreaterThan(14 * 1024);
    expect(totalKiB).toBeLessThanOrEqual(16 * 1024);
    // ...and writing past it fails with ENOSPC; what was written stays under the cap.
    const dd = await rt.exec('full', cmd('dd if=/dev/zero of=/root/big bs=1M count=24'));
    expect(dd.exitCode).not.toBe(0);
    expect(dd.stderr).toMatch(/No space left on device/);
    const size = Number((await rt.exec('full', cmd('stat -c %s /root/big'))).stdout);
    expect(size).toBeGreaterThan(8 * MIB);
    expect(size).toBeLessThanOrEqual(16 * MIB);
    // Topped up to the last block, not even a small new file fits.
    expect((await rt.exec('full', cmd('dd if=/dev/zero of=/root/rest bs=4k 2>/dev/null; echo more > /root/note'))).stderr).toMatch(/No space left on device/);
    expect((await rt.exec('full', cmd('rm /root/rest'))).exitCode).toBe(0);

    // The neighbour is not affected.
    const neighbour = await rt.exec('roomy', cmd('dd if=/dev/zero of=/root/big bs=1M count=24 && stat -c %s /root/big'));
    expect(neighbour).toMatchObject({ exitCode: 0, stdout: `${24 * MIB}\n` });

    // Deleting frees the space inside the sandbox.
    expect((await rt.exec('full', cmd('rm /root/big && dd if=/dev/zero of=/root/big bs=1M count=8'))).exitCode).toBe(0);

    // Inodes are capped too (16 MiB: 4096), with ENOSPC. `true > f` creates a file without
    // a fork (with `:`, a special builtin, the failed redirect would end the shell).
    const flood = await rt.exec('full', cmd('mkdir /root/many && cd /root/many && i=0; while true > f$i; do i=$((i+1)); done; echo $i', { timeoutMs: 30_000 }));
    const files = Number(flood.stdout.trim());
    expect(flood.stderr).toMatch(/No space left on device/);
    expect(files).toBeGreaterThan(4000);
    expect(files).toBeLessThanOrEqual(4096);
    expect((await rt.exec('roomy', cmd('mkdir /root/d && : > /root/d/x && echo ok'))).stdout).toBe('ok\n');

    // After destroy the disk and its space are gone; the same id gets a fresh, empty disk.
    const scratchFree = (): number => statfsSync(rt.scratchDir).bfree;
    const freeBefore = scratchFree();
    await rt.destroy('full');
    expectGone(rt, 'full');
    // The image's blocks are freed when its loop device lets go of it (asynchronously, see loopsAfterRelease).
    await loopsAfterRelease(() => (scratchFree() >= freeBefore + (16 * MIB) / 4096 - 64 ? '' : 'held'));
    const freeAfterDestroy = scratchFree();
    expect(freeAfterDestroy).toBeGreaterThanOrEqual(freeBefore + (16 * MIB) / 4096 - 64);
    await rt.create(spec('full', small));
    const again = await rt.exec('full', cmd('ls /root; dd if=/dev/zero of=/root/big bs=1M count=12 2>/dev/null && echo wrote'));
    expect(again).toMatchObject({ exitCode: 0, stdout: 'wrote\n' }); // and /root was empty
    await rt.destroy('full');
    await loopsAfterRelease(() => (scratchFree() >= freeAfterDestroy - 8 ? '' : 'held'));
    expect(scratchFree()).toBeGreaterThanOrEqual(freeAfterDestroy - 8);
    // Loop devices of sandbox disks detach themselves once their overlay is gone.
    expect(await loopsAfterRelease(() => loopsUnderTop().filter((l) => l.includes('/scratch/disks/full.img')))).toEqual([]);
    await rt.destroy('roomy');
    expectGone(rt, 'roomy');
    expect(await loopsAfterRelease(() => loopsUnderTop().filter((l) => l.includes('/scratch/disks/')))).toEqual([]);
  });

  it('refuses a disk that does not fit in the scratch filesystem and leaves nothing behind', async () => {
    const rt = newRuntime();
    const huge = { resources: { cpuMillis: 1000, memoryMiB: 64, diskMiB: (SCRATCH_GIB + 1) * 1024, pids: 64 } };
    await expect(rt.create(spec('huge', huge))).rejects.toMatchObject({ code: 'no_capacity' });
    expectGone(rt, 'huge');
    await expect(rt.create(spec('bad-disk', { resources: { cpuMillis: 1000, memoryMiB: 64, diskMiB: 0, pids: 64 } }))).rejects.toMatchObject({ code: 'invalid_request' });
    // The scratch filesystem is still usable.
    await rt.create(spec('fits'));
    expect((await rt.exec('fits', cmd('echo ok > /root/x && cat /root/x'))).stdout).toBe('ok\n');
    await rt.destroy('fits');
    expectGone(rt, 'fits');
  });

  it('reconcile adopts kept sandboxes after a restart and removes everything else', async () => {
    const previous = newRuntime();
    await previous.create(spec('keep', { layerImages: [base], resources: { cpuMillis: 1000, memoryMiB: 64, diskMiB: 8, pids: 64 } }));
    await previous.create(spec('drop', { layerImages: [base, extra] }));
    await previous.exec('keep', cmd('echo state > /root/state'));

    // Leftovers of an older, crashed run: a bundle with a host-mounted overlay, a stray
    // cgroup, and (through "drop") a layer mount nobody kept.
    const ghost = path.join(previous.sandboxesDir, 'ghost');
    for (const d of ['upper', 'work', 'rootfs']) await mkdir(path.join(ghost, d), { recursive: true });
    const baseDir = path.join(dataDir, 'mnt', 'layers', base.digest.slice(7));
    execFileSync('mount', ['-t', 'overlay', 'overlay', '-o', `lowerdir=${baseDir},upperdir=${ghost}/upper,workdir=${ghost}/work`, `${ghost}/rootfs`]);
    for (const r of cgroupRoots) await mkdir(path.join(r, 'rollbox', nodeId, 'rb-ghost2'), { recursive: true });

    // "Restart": a fresh runtime and layer-mount instance over the same data dir.
    const rt = newRuntime();
    const result = await rt.reconcile(new Set(['keep', 'gone-before-restart']));
    expect(result.adopted).toEqual(['keep']);
    expect(result.missing).toEqual(['gone-before-restart']);
    expect(result.removed).toEqual(expect.arrayContaining(['drop', 'ghost', 'ghost2']));
    expect(result.removed).not.toContain('keep');

    expect(await rt.isRunning('keep')).toBe(true);
    expect((await rt.exec('keep', cmd('cat /root/state; pwd'))).stdout).toBe('state\n/work\n');
    // Its disk cap survived the restart.
    expect((await rt.exec('keep', cmd('dd if=/dev/zero of=/root/big bs=1M count=16'))).stderr).toMatch(/No space left on device/);
    expect(rt.mountedLayers()).toEqual([base.digest]);
    expect(await loopsAfterRelease(() => loopsOf(extra.imagePath))).toBe('');
    for (const id of ['drop', 'ghost', 'ghost2']) expectGone(rt, id);
    // The scratch filesystem was reused, with the kept sandbox's disk still in it: held by
    // its overlay and its loop device, not mounted on the host (see releaseFromHost).
    expect(mountsUnderTop().sort()).toEqual([baseDir, rt.scratchDir].sort());
    expect(readdirSync(path.join(rt.scratchDir, 'disks'))).toEqual(['keep.img']);
    expect(loopsOf(path.join(rt.scratchDir, 'disks', 'keep.img'))).not.toBe('');

    await rt.destroy('keep');
    expectGone(rt, 'keep');
    expect(mountsUnderTop()).toEqual([]);
    expect(await loopsAfterRelease(() => loopsOf(base.imagePath))).toBe('');
    const final = await rt.reconcile(new Set());
    expect(final.adopted).toEqual([]);
    // Nothing is left: no mount, no loop device, no scratch image.
    expect(mountsUnderTop()).toEqual([]);
    expect(await loopsAfterRelease(loopsUnderTop)).toEqual([]);
    expect(existsSync(path.join(dataDir, 'scratch.img'))).toBe(false);
    expect(cgroupRoots.filter((r) => existsSync(path.join(r, 'rollbox', nodeId)))).toEqual([]);
  });
});
