/**
 * The adversarial suite: what an agent might try from inside its sandbox, as root. Each
 * probe asserts that the wall held (fails closed) AND that one neighbour sandbox, shared
 * by the whole file, still answers with its own state intact. Probes are kept small (16 MiB
 * disks, 32 MiB memory, 64 pids) so the file runs in a few tens of seconds.
 */
import type { ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { pack } from 'tar-stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ExecResult } from '../src/api/index.ts';
import { BESTEFFORT_ROOT, DEFAULT_CAPABILITIES } from '../src/workers/runtime/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { hostTraces } from './support/host.ts';
import { SYSCALLS, syscallProbe } from './support/syscall-probe.ts';

const NODE = 'node-adv';
let cluster: TestCluster;
let token: string;
/** The worker host runs as its own process: its memory can be read, and its death would show. */
let worker: ChildProcess;
let neighbour: string;
const NEIGHBOUR_MARKER = `neighbour-${randomBytes(6).toString('hex')}`;

const run = async (id: string, cmd: string, extra: object = {}): Promise<ExecResult> => {
  const r = await api<ExecResult>(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, ...extra });
  if (r.status !== 200) {
    // Say what became of the sandbox and the worker, not only that the exec was refused.
    const sandbox = await api(cluster, token, 'GET', `/v1/sandboxes/${id}`);
    expect.fail(`exec ${r.status} ${JSON.stringify(r.body)}; sandbox ${JSON.stringify(sandbox.body)}; worker exit ${worker.exitCode ?? worker.signalCode}`);
  }
  return r.body;
};

async function createSandbox(body: object = {}): Promise<string> {
  const r = await api(cluster, token, 'POST', '/v1/sandboxes', body);
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body.id as string;
}

const release = (...ids: string[]) => Promise.all(ids.map((id) => api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`)));

/** The neighbour still runs commands, and still has what it wrote before the probe. */
async function expectNeighbourUnaffected(): Promise<void> {
  expect(worker.exitCode ?? worker.signalCode).toBeNull();
  const r = await run(neighbour, 'cat /root/marker; echo $((6 * 7))');
  expect(r).toMatchObject({ exitCode: 0, stdout: `${NEIGHBOUR_MARKER}\n42\n` });
}

const sha256 = (file: string) => createHash('sha256').update(fs.readFileSync(file)).digest('hex');
const scratchDir = () => path.join(cluster.rootDir, NODE, 'worker', 'scratch');
const freeMiB = (dir: string) => {
  const s = fs.statfsSync(dir);
  return (s.bavail * s.bsize) / 1024 / 1024;
};

beforeAll(async () => {
  // The probes load the host on purpose: a slow heartbeat must not be taken for a lost node.
  // Memory pressure is what some of these tests make on purpose: admission by PSI is off here, so a later test's create is not refused by an earlier one's balloon.
  cluster = await startTestCluster({ env: { ROLLBOX_NODE_LOST_AFTER_MS: '10000', ROLLBOX_NODE_PSI_MEMORY_MAX: '0' } });
  worker = await cluster.spawnWorker({ nodeId: NODE });
  token = await cluster.token('adversary', ['layer:write', 'sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'admin']);
  await waitFor('worker heartbeat', async () => (await api(cluster, token, 'GET', '/v1/nodes')).body.nodes?.length === 1);
  neighbour = await createSandbox({ resources: { memoryMiB: 64, diskMiB: 64 } });
  expect((await run(neighbour, `echo ${NEIGHBOUR_MARKER} > /root/marker`)).exitCode).toBe(0);
});
afterAll(async () => {
  await cluster?.stop();
  expect(hostTraces(cluster.rootDir)).toEqual({ mounts: [], loops: [], containers: [] });
});

describe('resource walls', () => {
  it('stops a fork bomb at the pids limit; the bombed sandbox recovers', async () => {
    // A CPU quota keeps the bomb from starving the other test files running beside this one.
    const bomb = await createSandbox({ resources: { pids: 64, memoryMiB: 128, cpuMillis: 250 } });
    const running = run(bomb, 'bomb() { bomb | bomb & }; bomb', { timeoutMs: 3000 });
    let ended = false;
    void running.finally(() => (ended = true));
    const pidsCurrent = path.join('/sys/fs/cgroup/pids/rollbox', NODE, `rb-${bomb}`, 'pids.current');
    await waitFor('the bomb to fill its pids limit', async () => ended || Number(fs.readFileSync(pidsCurrent, 'utf8')) >= 32);
    await expectNeighbourUnaffected(); // while the bomb is going off
    const bombed = await running;
    expect(bombed.stderr).toMatch(/can't fork|Resource temporarily unavailable/);
    // EAGAIN on fork is the pids limit (memory would say ENOMEM). The bomb may burn out
    // before its timeout (shells that cannot fork exit), so timedOut is not asserted.
    // Once the bomb's command has ended (burnt out or killed at its timeout), the sandbox answers again.
    expect((await run(bomb, 'echo recovered')).stdout).toBe('recovered\n');
    await release(bomb);
    await expectNeighbourUnaffected();
  });

  it('OOM-kills a memory balloon at memoryMiB; the sandbox and the worker keep answering', async () => {
    const balloon = await createSandbox({ resources: { memoryMiB: 32 } });
    // tail keeps the current line in memory, and /dev/zero never ends one.
    const r = await run(balloon, 'tail /dev/zero', { timeoutMs: 30_000 });
    expect(r.oomKilled).toBe(true);
    expect(r.exitCode).not.toBe(0);
    expect(r.timedOut).toBe(false);
    const after = await api(cluster, token, 'GET', `/v1/sandboxes/${balloon}`);
    expect(after.body).toMatchObject({ state: 'running', oomKills: expect.any(Number) });
    expect(after.body.oomKills).toBeGreaterThanOrEqual(1);
    expect((await run(balloon, 'echo alive')).stdout).toBe('alive\n');
    await release(balloon);
    await expectNeighbourUnaffected();
  });

  it('fails a disk fill with ENOSPC at diskMiB; the host scratch space does not fill', async () => {
    const filler = await createSandbox({ resources: { diskMiB: 16 } });
    const scratchFreeBefore = freeMiB(scratchDir());
    const fill = await run(filler, 'dd if=/dev/zero of=/root/big bs=1M count=64 2>&1; sync; stat -c %s /root/big');
    expect(fill.stdout).toContain('No space left on device');
    const sizeBytes = Number(fill.stdout.trim().split('\n').at(-1));
    expect(sizeBytes).toBeGreaterThan(8 * 1024 * 1024);
    expect(sizeBytes).toBeLessThanOrEqual(16 * 1024 * 1024);
    // The scratch filesystem lost at most the disk's 16 MiB (and the host disk even less).
    expect(scratchFreeBefore - freeMiB(scratchDir())).toBeLessThanOrEqual(17);
    // Deleting frees the disk again: the sandbox is not wedged.
    expect((await run(filler, 'rm /root/big && echo x > /root/small && cat /root/small')).stdout).toBe('x\n');
    await release(filler);
    await expectNeighbourUnaffected();
  });

  it('fails an inode fill with ENOSPC inside the sandbox; the host keeps its inodes', async () => {
    const filler = await createSandbox({ resources: { diskMiB: 16 } });
    const hostInodesBefore = fs.statfsSync(cluster.rootDir).ffree;
    // `true >file` is a builtin with a redirection: no fork per file (and, unlike `:`, not a
    // special builtin, whose failed redirection would end the shell).
    const fill = await run(filler, 'mkdir /root/many && cd /root/many && i=0; while true 2>/dev/null >f$i; do i=$((i+1)); done; echo $i; echo x >one-more', { timeoutMs: 30_000 });
    expect(fill.stderr).toContain('No space left on device');
    const files = Number(fill.stdout.trim());
    expect(files).toBeGreaterThan(1000);
    expect(files).toBeLessThanOrEqual(4096); // inodesForDisk(16)
    // The sandbox's thousands of files are not host inodes (other test files on the host
    // create some meanwhile, hence a margin).
    expect(hostInodesBefore - fs.statfsSync(cluster.rootDir).ffree).toBeLessThan(files / 2);
    await release(filler);
    await expectNeighbourUnaffected();
  });
});

/** Peak and current resident memory of a process, MiB. */
function memoryMiB(pid: number): { rss: number; peak: number } {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)![1]) / 1024;
  return { rss: kib('VmRSS'), peak: kib('VmHWM') };
}

describe('output flood', () => {
  it('keeps worker memory bounded while a command floods stdout, plain and streamed', async () => {
    // A CPU quota paces the flood so it does not starve the other test files on this host.
    const flooder = await createSandbox({ resources: { memoryMiB: 64, cpuMillis: 300 } });
    await run(flooder, 'echo warm'); // warm-up: first exec paths, JIT
    const floodBytes = 100 * 1024 * 1024;
    const before = memoryMiB(worker.pid!);
    // head only finishes once the worker has read every byte from the pipe; it keeps the cap.
    const plain = await run(flooder, `head -c ${floodBytes} /dev/zero; echo flooded >&2`, { timeoutMs: 120_000 });
    expect(plain.stderr).toBe('flooded\n');
    expect(plain).toMatchObject({ exitCode: 0, truncated: true, timedOut: false });
    expect(plain.stdout.length).toBe(cluster.config.node.execOutputCapBytes);

    // Streamed (SSE): only the capped part goes to Redis and to the client.
    const streamed = await fetch(`${cluster.url}/v1/sandboxes/${flooder}/exec`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', accept: 'text/event-stream' },
      body: JSON.stringify({ cmd: `head -c ${floodBytes} /dev/zero`, timeoutMs: 120_000 }),
    });
    const events = await streamed.text();
    expect(streamed.status, events.slice(0, 500)).toBe(200);
    expect(events).toContain('"truncated":true');
    expect(events.length).toBeLessThan(4 * cluster.config.node.execOutputCapBytes);

    const after = memoryMiB(worker.pid!);
    // 200 MiB went through the worker; its peak resident memory grew by far less.
    expect(after.peak - before.peak, JSON.stringify({ before, after })).toBeLessThan(100);
    await release(flooder);
    await expectNeighbourUnaffected();
  });
});

describe('cpu classes', () => {
  it('runs every besteffort process under SCHED_IDLE with a tiny CPU weight; latency stays normal', async () => {
    const [besteffort, latency] = await Promise.all([createSandbox({ class: 'besteffort' }), createSandbox({ class: 'latency' })]);
    // The init, the exec'd command, and a child it starts (SCHED_IDLE is 5, SCHED_OTHER 0).
    const policies = "for p in 1 self; do grep -h '^policy' /proc/$p/sched; done; sleep 5 & grep -h '^policy' /proc/$!/sched; kill $!";
    const policyOf = async (id: string) => (await run(id, policies)).stdout.split('\n').filter(Boolean).map((line) => Number(line.split(':')[1]));
    expect(await policyOf(besteffort)).toEqual([5, 5, 5]);
    expect(await policyOf(latency)).toEqual([0, 0, 0]);
    const cpu = (id: string, file: string) => Number(fs.readFileSync(`/sys/fs/cgroup/cpu/${id === besteffort ? BESTEFFORT_ROOT : 'rollbox'}/${NODE}/rb-${id}/${file}`, 'utf8'));
    expect(fs.readFileSync(`/sys/fs/cgroup/cpu/${BESTEFFORT_ROOT}/cpu.idle`, 'utf8').trim()).toBe('1');
    expect(cpu(besteffort, 'cpu.shares')).toBeLessThanOrEqual(3); // 2 as set; an idle group reads the idle weight, 3
    expect(cpu(latency, 'cpu.shares')).toBe(1024); // cpuMillis 1000
    expect([cpu(besteffort, 'cpu.idle'), cpu(latency, 'cpu.idle')]).toEqual([1, 0]);

    // The besteffort guard: a latency command the caller waits on holds besteffort
    // sandboxes at the smallest CFS quota; a background one does not.
    const quotasWhile = async (pending: Promise<unknown>, forMs: number) => {
      const seen = new Set<number>();
      const until = Date.now() + forMs;
      while (Date.now() < until) {
        seen.add(cpu(besteffort, 'cpu.cfs_quota_us'));
        await new Promise((r) => setTimeout(r, 20));
      }
      await pending;
      return [...seen];
    };
    const ownQuota = cpu(besteffort, 'cpu.cfs_quota_us');
    expect(await quotasWhile(run(latency, 'sleep 1.5'), 1000)).toContain(1000);
    expect(cpu(besteffort, 'cpu.cfs_quota_us')).toBe(ownQuota);
    const background = await api(cluster, token, 'POST', `/v1/sandboxes/${latency}/exec`, { cmd: 'sleep 1.5', background: true });
    expect(background.status).toBe(202);
    expect(await quotasWhile(Promise.resolve(), 1000)).toEqual([ownQuota]);
    await release(besteffort, latency);
    await expectNeighbourUnaffected();
  });
});

describe('file walls', () => {
  it('keeps hiddenPaths unreadable to root by every route tried', async () => {
    const secret = `ANSWER-${randomBytes(6).toString('hex')}`;
    const archive = pack();
    const chunks: Buffer[] = [];
    archive.on('data', (c: unknown) => void chunks.push(c as Buffer));
    const ended = new Promise<void>((resolve) => archive.on('end', () => resolve()));
    archive.entry({ name: 'grader/', type: 'directory', mode: 0o755 });
    archive.entry({ name: 'grader/answer.txt', mode: 0o644 }, `${secret}\n`);
    archive.finalize();
    await ended;
    const layer = await api(cluster, token, 'POST', '/v1/layers?name=adv-grader', new Uint8Array(Buffer.concat(chunks)), { 'content-type': 'application/x-tar' });
    expect(layer.status, JSON.stringify(layer.body)).toBe(201);
    const agent = await createSandbox({ image: { base: 'busybox', layers: ['adv-grader'] }, hiddenPaths: ['/grader'] });

    const routes = [
      'cat /grader/answer.txt',
      'cat /proc/1/root/grader/answer.txt',
      'cat /proc/self/root/grader/answer.txt',
      'cd /proc/1/cwd && cat ./grader/answer.txt',
      'ln /grader/answer.txt /root/hardlink; cat /root/hardlink',
      'mkdir -p /mnt/g && mount --bind /grader /mnt/g; cat /mnt/g/answer.txt',
      'umount /grader; umount -l /grader; cat /grader/answer.txt',
      // The overlay's lower dirs are host paths; they are shown in mountinfo but not reachable.
      "for d in $(sed -n 's/.*lowerdir=\\([^,]*\\).*/\\1/p' /proc/self/mountinfo | tr : ' '); do cat $d/grader/answer.txt; done",
      // The layer's block device: /dev has none, and device nodes made by hand are not usable.
      'mknod /root/vdb b 7 0; cat /root/vdb | strings | grep ANSWER',
      'find / -path /proc -prune -o -path /sys -prune -o -type f -print 2>/dev/null | xargs grep -l ANSWER 2>/dev/null',
    ];
    for (const cmd of routes) {
      const r = await run(agent, cmd, { timeoutMs: 20_000 });
      expect(r.stdout + r.stderr, cmd).not.toContain(secret);
    }
    expect((await run(agent, 'id -u; ls -A /grader | wc -l')).stdout).toBe('0\n0\n');
    // Without hiddenPaths the same layer shows the file: the probes can tell the difference.
    const open = await createSandbox({ image: { base: 'busybox', layers: ['adv-grader'] } });
    expect((await run(open, 'cat /grader/answer.txt')).stdout).toBe(`${secret}\n`);
    await release(agent, open);
    await expectNeighbourUnaffected();
  });

  it('masks /proc and /sys and keeps them read-only', async () => {
    const agent = await createSandbox();
    const r = await run(
      agent,
      [
        'echo kcore=$(cat /proc/kcore 2>/dev/null | wc -c)',
        'echo keys=$(cat /proc/keys 2>/dev/null | wc -l)',
        'echo firmware=$(ls -A /sys/firmware | wc -l)',
        'echo b > /proc/sysrq-trigger && echo sysrq=written',
        'echo evil > /proc/sys/kernel/hostname && echo hostname=written',
        'echo 1 > /proc/sys/vm/drop_caches && echo drop_caches=written',
        'touch /sys/kernel/rollbox && echo sys=written',
        'echo 1 > /sys/kernel/mm/ksm/run && echo ksm=written',
        'true',
      ].join('; '),
    );
    expect(r.stdout).toBe('kcore=0\nkeys=0\nfirmware=0\n');
    expect(r.stderr).toMatch(/Read-only file system/);
    await release(agent);
    await expectNeighbourUnaffected();
  });

  it('does not let /proc/self/exe overwrite the runtime, the host busybox or the layer', async () => {
    const runcPath = '/usr/sbin/runc';
    const layers = await api(cluster, token, 'GET', '/v1/layers');
    const base = layers.body.layers.find((l: { name?: string }) => l.name === 'busybox');
    const layerFiles = ['meta', 'blob'].map((ext) => path.join(cluster.config.layerStoreDir, 'sha256', `${base.digest.slice(7)}.${ext}`));
    const watched = [runcPath, '/bin/busybox', ...layerFiles];
    const before = watched.map(sha256);
    const neighbourBusybox = (await run(neighbour, 'sha256sum /bin/busybox')).stdout;

    const agent = await createSandbox();
    const direct = await run(agent, 'echo pwned > /proc/self/exe; cp /bin/true /proc/1/exe; echo pwned > /.rollbox/busybox; echo pwned >> /bin/busybox; true');
    expect(direct.stderr).toMatch(/Text file busy|Read-only file system|Permission denied/);
    // Race every process that appears (runc exec's own init among them) while execs run.
    const racing = run(agent, 'end=$(($(date +%s) + 2)); while [ $(date +%s) -lt $end ]; do for p in /proc/[0-9]*; do (echo pwned >$p/exe) 2>/dev/null; done; done', { timeoutMs: 20_000 });
    for (let i = 0; i < 8; i++) expect((await run(agent, 'echo $$')).exitCode).toBe(0);
    await racing;

    expect(watched.map(sha256)).toEqual(before);
    expect((await run(neighbour, 'sha256sum /bin/busybox')).stdout).toBe(neighbourBusybox);
    expect((await run(agent, 'echo still-works')).stdout).toBe('still-works\n');
    await release(agent);
    await expectNeighbourUnaffected();
  });

  it('never reaches host files from a working directory under /proc/self/fd (CVE-2024-21626 class)', async () => {
    const canary = `HOST-CANARY-${randomBytes(6).toString('hex')}`;
    const canaryPath = path.join(cluster.rootDir, 'host-canary.txt');
    fs.writeFileSync(canaryPath, `${canary}\n`);
    const up = '../'.repeat(12);
    const agent = await createSandbox();
    for (const cwd of ['/proc/self/fd/7', '//proc/self/fd/8', '/tmp/../proc/1/cwd', '/proc']) {
      const refused = await api(cluster, token, 'POST', `/v1/sandboxes/${agent}/exec`, { cmd: 'pwd', cwd });
      expect(refused.status, cwd).toBe(400);
      expect(refused.body.error.message).toContain('cwd');
    }
    // Symlinks made inside get past the API's check: runc must refuse them or stay inside.
    expect((await run(agent, 'for fd in 3 4 5 6 7 8 9 10 11 12; do ln -s /proc/self/fd/$fd /root/fd$fd; done')).exitCode).toBe(0);
    for (let fd = 3; fd <= 12; fd++) {
      const r = await run(agent, `pwd; cat ${up}${canaryPath.slice(1)}`, { cwd: `/root/fd${fd}` });
      expect(JSON.stringify(r), `fd ${fd}`).not.toContain(canary);
      if (r.exitCode === 0) expect(r.stdout).not.toMatch(/cgroup|\/sys\/fs/);
      else expect(r.stderr).toContain('cannot start command');
    }
    const inside = await run(agent, `for d in /proc/self/fd/* /proc/1/fd/* /proc/1/cwd /proc/1/root; do (cd $d 2>/dev/null && cat ${up}${canaryPath.slice(1)}) 2>/dev/null; done; echo done`);
    expect(inside.stdout).toBe('done\n');
    await release(agent);
    await expectNeighbourUnaffected();
  });
});

describe('privilege walls', () => {
  it('refuses mount, unshare, setns, ptrace, bpf, keyctl, kexec and module loading', async () => {
    const agent = await createSandbox();
    const tools = await run(
      agent,
      [
        'mkdir -p /mnt/t; mount -t tmpfs t /mnt/t; echo mount=$?',
        'unshare -m true; echo unshare_mnt=$?',
        'unshare -U true; echo unshare_user=$?',
        'unshare -n true; echo unshare_net=$?',
        'nsenter -t 1 -m true; echo nsenter=$?',
        'nsenter -t 1 -n -m -p true; echo nsenter_all=$?',
      ].join('; '),
    );
    for (const line of tools.stdout.trim().split('\n')) expect(line, tools.stderr).not.toMatch(/=0$/);
    expect(tools.stderr).toContain('Operation not permitted');

    // The raw calls: each must come back EPERM (1) from the seccomp filter, not "got in and
    // failed on an argument" (EFAULT, EINVAL, EBADF) and not success (0).
    const calls: [keyof typeof SYSCALLS, (number | bigint)[]][] = [
      ['mount', []],
      ['umount2', []],
      ['unshare', [0x10000000]], // CLONE_NEWUSER: unprivileged elsewhere, a full capability set inside
      ['unshare', [0x00020000]], // CLONE_NEWNS
      ['setns', [-1, 0]], // EBADF if it got through
      ['ptrace', [0]], // PTRACE_TRACEME: would succeed without the filter
      ['keyctl', [0, -3, 0]], // KEYCTL_GET_KEYRING_ID of the session keyring: would succeed
      ['bpf', [5, 0, 0]],
      ['init_module', []],
      ['kexec_load', []],
      ['open_by_handle_at', [-1, 0, 0]],
      ['perf_event_open', []],
      ['userfaultfd', [0]],
      ['io_uring_setup', [1, 0]],
    ];
    const script = calls.map(([name, args], i) => `base64 -d > /root/p${i} <<'EOF'\n${syscallProbe(SYSCALLS[name], args).toString('base64')}\nEOF\nchmod +x /root/p${i}; /root/p${i}; echo ${name}=$?`).join('\n');
    const raw = await run(agent, script);
    expect(raw.stdout.trim().split('\n')).toEqual(calls.map(([name]) => `${name}=1`));
    await release(agent);
    await expectNeighbourUnaffected();
  });

  it('runs commands with no_new_privs, seccomp on, and the reduced capability set only', async () => {
    const agent = await createSandbox();
    const r = await run(agent, "grep -E '^(NoNewPrivs|Seccomp|CapEff|CapPrm|CapBnd|CapInh|CapAmb):' /proc/self/status");
    const status = Object.fromEntries(r.stdout.trim().split('\n').map((line) => line.split(/:\s+/) as [string, string]));
    const capBits: Record<string, number> = {
      CAP_CHOWN: 0, CAP_DAC_OVERRIDE: 1, CAP_FOWNER: 3, CAP_FSETID: 4, CAP_KILL: 5, CAP_SETGID: 6, CAP_SETUID: 7, CAP_SETPCAP: 8,
      CAP_NET_BIND_SERVICE: 10, CAP_NET_RAW: 13, CAP_SYS_CHROOT: 18, CAP_MKNOD: 27, CAP_AUDIT_WRITE: 29, CAP_SETFCAP: 31,
    };
    const expected = DEFAULT_CAPABILITIES.reduce((mask, cap) => mask | (1n << BigInt(capBits[cap]!)), 0n);
    expect(status.NoNewPrivs).toBe('1');
    expect(status.Seccomp).toBe('2'); // filter mode
    for (const field of ['CapEff', 'CapPrm', 'CapBnd']) expect(BigInt(`0x${status[field]}`), field).toBe(expected);
    expect(BigInt(`0x${status.CapInh}`)).toBe(0n);
    expect(BigInt(`0x${status.CapAmb}`)).toBe(0n);
    for (const dangerous of [2 /* DAC_READ_SEARCH */, 12 /* NET_ADMIN */, 16 /* SYS_MODULE */, 19 /* SYS_PTRACE */, 21 /* SYS_ADMIN */, 39 /* BPF */]) {
      expect(expected & (1n << BigInt(dangerous))).toBe(0n);
    }
    await release(agent);
    await expectNeighbourUnaffected();
  });
});

/**
 * Results come from rollbox-init's own waitpid and travel over a channel the sandbox
 * cannot reach (src/workers/init). Each probe attacks the init or the channel, then an
 * exec must still report its true exit status and output.
 */
describe('result walls (the sandbox init)', () => {
  const truth = async (id: string) => {
    const code = 3 + Math.floor(Math.random() * 100);
    const word = randomBytes(4).toString('hex');
    expect(await run(id, `echo ${word}; echo err-${word} >&2; exit ${code}`)).toMatchObject({ exitCode: code, stdout: `${word}\n`, stderr: `err-${word}\n` });
  };
  const initPidOf = (id: string) => JSON.parse(fs.readFileSync(path.join(cluster.rootDir, NODE, 'worker', 'runc', `rb-${id}`, 'state.json'), 'utf8')).init_process_pid as number;

  it('ignores every signal sent to PID 1 from inside, kill -9 included', async () => {
    const agent = await createSandbox();
    const pid = initPidOf(agent);
    const r = await run(agent, 'for s in $(seq 1 64); do kill -$s 1 2>/dev/null; done; kill -9 1; kill -STOP 1; kill -KILL -1; echo after');
    expect(r.stdout).toBe('after\n'); // kill -KILL -1 spares the init (and the shell itself)
    expect(initPidOf(agent)).toBe(pid);
    await truth(agent);
    await release(agent);
    await expectNeighbourUnaffected();
  });

  it("keeps the init's memory, environment and file descriptors out of reach (/proc/1/*, pidfd_getfd)", async () => {
    const agent = await createSandbox();
    const r = await run(agent, [
      'head -c 64 /proc/1/environ; echo environ=$?',
      // The fd numbers may be listed; what they are may not be read, nor opened.
      'for fd in /proc/1/fd/*; do readlink $fd; cat $fd; done 2>/dev/null | wc -c; echo fdread=$?',
      'readlink /proc/1/fd/3; echo fd3=$?',
      'cat /proc/1/fd/3; echo fd3open=$?',
      'dd if=/proc/1/mem bs=1 count=1 skip=4194304 2>&1; echo memread=$?',
      'echo x | dd of=/proc/1/mem bs=1 seek=4194304 2>&1; echo memwrite=$?',
      'cat /proc/1/maps; echo maps=$?',
      'ls -l /proc/1/cwd/ /proc/1/root/; echo root=$?',
    ].join('\n'));
    expect(r.stdout).toMatch(/^0\nfdread=0$/m);
    for (const probe of ['environ', 'fd3', 'fd3open', 'memread', 'memwrite', 'maps', 'root']) expect(r.stdout, r.stdout + r.stderr).toMatch(new RegExp(`^${probe}=[1-9]`, 'm'));
    expect(r.stdout + r.stderr).toContain('Permission denied');
    expect(r.stdout).not.toMatch(/PATH=|socket:|rollbox-init/);
    // pidfd_open(1) then pidfd_getfd(its fd, 3): EPERM (1), the init is not dumpable.
    const probe = syscallProbe(SYSCALLS.pidfd_open, [1, 0], { nr: SYSCALLS.pidfd_getfd, args: [0, 3, 0] });
    const getfd = await run(agent, `base64 -d > /root/getfd <<'EOF'\n${probe.toString('base64')}\nEOF\nchmod +x /root/getfd; /root/getfd; echo getfd=$?`);
    expect(getfd.stdout).toBe('getfd=1\n');
    await truth(agent);
    await release(agent);
    await expectNeighbourUnaffected();
  });

  it('cannot replace or overwrite the init binary, and cannot see or reach its channel', async () => {
    const agent = await createSandbox();
    const initBinary = path.resolve(import.meta.dirname, '../build/rollbox-init');
    const before = sha256(initBinary);
    const r = await run(agent, [
      'cp /bin/busybox /.rollbox/init; echo cp=$?',
      'echo pwned > /.rollbox/init; echo write=$?',
      'rm -f /.rollbox/init; echo rm=$?',
      'mv /.rollbox /.moved; echo mv=$?',
      'echo pwned > /proc/1/exe; echo exe=$?',
      // Unix sockets of the sandbox's network namespace: none named, none listening (the
      // init's keeper pairs are unnamed); and none in its filesystem.
      "awk 'NR > 1 && (NF >= 8 || $4 == \"00010000\")' /proc/net/unix | wc -l; find / -xdev -type s 2>/dev/null | wc -l",
    ].join('\n'));
    for (const probe of ['cp', 'write', 'rm', 'mv', 'exe']) expect(r.stdout, r.stdout + r.stderr).toMatch(new RegExp(`^${probe}=[1-9]`, 'm'));
    expect(r.stdout.trim().split('\n').slice(-2)).toEqual(['0', '0']);
    expect(sha256(initBinary)).toBe(before);
    // Output that looks like a protocol frame (an EXIT with status 0) is just output.
    const fake = Buffer.from([20, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    const forged = await run(agent, `printf '${[...fake].map((b) => `\\${b.toString(8).padStart(3, '0')}`).join('')}'; printf '${[...fake].map((b) => `\\${b.toString(8).padStart(3, '0')}`).join('')}' >&2; exit 9`);
    expect(forged.exitCode).toBe(9);
    expect(Buffer.from(forged.stdout, 'latin1').length).toBe(fake.length);
    await truth(agent);
    await release(agent);
    await expectNeighbourUnaffected();
  });

  it('reports true results beside a fork bomb and a memory balloon, and for commands that close or dup2 every fd', async () => {
    const agent = await createSandbox({ resources: { memoryMiB: 64, pids: 64, diskMiB: 16 } });
    const bomb = run(agent, 'b() { while :; do b & done; }; b', { timeoutMs: 2000 });
    const balloon = run(agent, 'tail /dev/zero', { timeoutMs: 20_000 });
    const [bombed, ballooned] = await Promise.all([bomb, balloon]);
    expect(bombed.timedOut || /can't fork|Resource temporarily unavailable/.test(bombed.stderr)).toBe(true);
    // Beside the bomb the balloon either ran into the memory limit or could not even start
    // (the bomb held every pid): never a success.
    expect(ballooned.exitCode).not.toBe(0);
    expect(ballooned.oomKilled || /can't fork|Resource temporarily unavailable|cannot start command/.test(ballooned.stderr), JSON.stringify(ballooned)).toBe(true);
    await truth(agent);
    expect(await run(agent, 'tail /dev/zero', { timeoutMs: 20_000 })).toMatchObject({ oomKilled: true, exitCode: 137 });
    await truth(agent);
    const closed = await run(agent, 'exec 0<&- 1>&- 2>&-; exit 4');
    expect(closed).toMatchObject({ exitCode: 4, stdout: '', stderr: '' });
    const shuffled = await run(agent, 'exec 3>&1 1>&2 2>&3; for fd in 3 4 5 6 7 8 9; do eval "exec $fd>&-"; done; echo to-stderr; echo to-stdout >&2; exit 6');
    expect(shuffled).toMatchObject({ exitCode: 6, stdout: 'to-stdout\n', stderr: 'to-stderr\n' });
    await truth(agent);
    await release(agent);
    await expectNeighbourUnaffected();
  });

  it('fails the sandbox init_lost when its init is killed from the host; the running command is result_unknown', async () => {
    const agent = await createSandbox();
    const running = api(cluster, token, 'POST', `/v1/sandboxes/${agent}/exec`, { cmd: 'sleep 30' });
    await waitFor('the command to run', async () => (await api(cluster, token, 'GET', `/v1/sandboxes/${agent}/commands`)).body.commands?.[0]?.state === 'running');
    process.kill(initPidOf(agent), 'SIGKILL');
    const r = await running;
    expect(r.status, JSON.stringify(r.body)).toBe(409);
    expect(r.body.error.code).toBe('result_unknown');
    const failed = await waitFor('the sandbox to fail', async () => {
      const s = await api(cluster, token, 'GET', `/v1/sandboxes/${agent}`);
      return s.body.state === 'failed' && s.body;
    });
    expect(failed.failureReason).toBe('init_lost');
    // An idle sandbox whose init dies is noticed too (the worker's init watch).
    const idle = await createSandbox();
    process.kill(initPidOf(idle), 'SIGKILL');
    const idleFailed = await waitFor('the idle sandbox to fail', async () => {
      const s = await api(cluster, token, 'GET', `/v1/sandboxes/${idle}`);
      return s.body.state === 'failed' && s.body;
    });
    expect(idleFailed.failureReason).toBe('init_lost');
    const refused = await api(cluster, token, 'POST', `/v1/sandboxes/${idle}/exec`, { cmd: 'true' });
    expect(refused.status).toBe(409);
    await expectNeighbourUnaffected();
  });
});
